"""The server on real llama.cpp workers: the tiny random GGUF (fast) and Gemma 3 270M.

Each test starts a server process (the test launcher, no forced runtime), so generation
runs in a worker subprocess exactly as under ``localrun serve``.
"""

from __future__ import annotations

import os
import signal
import time

import ollama
import openai
import pytest

from tests.conftest import needs_llama
from tests.support.servers import free_port, health

pytestmark = [needs_llama, pytest.mark.llama]


def serve(spawn_server, path, name: str):
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

    ModelStore(Settings()).import_path(path, name=name)
    port = free_port()
    return spawn_server(["tests.support.launch", "--port", str(port)], port=port, env={"LOCALRUN_RUNTIME__FORCE": ""})


def exercise(server, name: str, prompt: str) -> None:
    """Chat and completions, streamed and not, usage, a 404 — through both official clients."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        messages = [{"role": "user", "content": prompt}]
        whole = oai.chat.completions.create(model=name, messages=messages, max_tokens=8, temperature=0, seed=1)
        assert 0 < whole.usage.completion_tokens <= 8
        assert whole.usage.prompt_tokens > 3 and whole.choices[0].finish_reason in ("stop", "length")
        chunks = list(
            oai.chat.completions.create(
                model=name,
                messages=messages,
                max_tokens=8,
                temperature=0,
                seed=1,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole.choices[0].message.content  # greedy: the same answer
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the same prompt: prefix reused

        comp = oai.completions.create(model=name, prompt="The capital of France is", max_tokens=6, temperature=0)
        assert 0 < comp.usage.completion_tokens <= 6
        parts = list(
            oai.completions.create(
                model=name, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
            )
        )
        assert "".join(p.choices[0].text for p in parts) == comp.choices[0].text

        with pytest.raises(openai.NotFoundError, match="missing-model"):
            oai.chat.completions.create(model="missing-model", messages=messages)
    oll = ollama.Client(host=server.url, timeout=120)
    r = oll.chat(
        model=name,
        messages=[{"role": "user", "content": prompt}],
        options={"temperature": 0, "num_predict": 8, "seed": 1},
    )
    assert r.done and r.eval_count and r.eval_count <= 8
    assert r.message.content == whole.choices[0].message.content
    parts = list(
        oll.generate(
            model=name,
            prompt="The capital of France is",
            raw=True,
            options={"temperature": 0, "num_predict": 6},
            stream=True,
        )
    )
    assert "".join(p.response for p in parts) == comp.choices[0].text
    ps = oll.ps().models
    assert ps[0].model == f"{name}:latest" and ps[0].context_length > 0  # Ollama tags an untagged name :latest


def kill_mid_stream(server, name: str) -> None:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as oai:
        stream = oai.completions.create(
            model=name, prompt="Once upon a time", max_tokens=2000, temperature=0, stream=True
        )
        it = iter(stream)
        assert next(it).choices
        worker = health(server.url)["models"][0]["pid"]
        assert worker != server.pid
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(openai.APIError):
            for _ in it:
                pass
        assert time.monotonic() - killed < 2.0
        assert server.proc.poll() is None and health(server.url)["pid"] == server.pid
        again = oai.completions.create(model=name, prompt="Hello", max_tokens=3, temperature=0)
        assert again.usage.completion_tokens > 0


def test_tiny_gguf_through_both_clients(spawn_server, tiny_gguf):
    server = serve(spawn_server, tiny_gguf, "tiny")
    exercise(server, "tiny", "hello there friend")


@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_through_both_clients_and_a_killed_worker(spawn_server, gemma_gguf):
    server = serve(spawn_server, gemma_gguf, "gemma")
    # Long enough that the scheduler's prefix reuse applies: it always re-evaluates a short tail.
    exercise(
        server,
        "gemma",
        "You are a friendly assistant on a small computer. Please say hello to me in one short word, and nothing else.",
    )
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        answer = oai.chat.completions.create(
            model="gemma",
            messages=[{"role": "user", "content": "What is 2+2? Answer with a number."}],
            max_tokens=10,
            temperature=0,
        )
        assert "4" in answer.choices[0].message.content
    kill_mid_stream(server, "gemma")
