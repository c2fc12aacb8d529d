"""Real engines as upstreams: a second ``localrun serve`` on its own network host (real
llama.cpp on the tiny GGUF) and llama-cpp-python's ``llama_cpp.server``, both answering
through a front localrun to the official ``openai`` and ``ollama`` clients, streams included.
"""

from __future__ import annotations

import httpx
import ollama
import openai
import pytest

from tests.conftest import needs_llama
from tests.support.netns import other_host
from tests.support.servers import free_port, llama_cpp_server, start, upstream_localrun

pytestmark = [needs_llama, pytest.mark.llama]


@pytest.fixture(scope="module")
def engines(tiny_gguf, tmp_path_factory):
    """A localrun on another host serving "tiny" (llama.cpp), and llama_cpp.server serving "tiny-cpp"."""
    pytest.importorskip("sse_starlette", reason="llama_cpp.server needs sse-starlette (the test extra)")
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

    logs = tmp_path_factory.mktemp("engine-logs")
    home = tmp_path_factory.mktemp("remote-home")
    ModelStore(Settings(data_dir=home / "data", cache_dir=home / "cache")).import_path(tiny_gguf, name="tiny")
    with other_host() as host:
        # ngram: drafts at every match (the tiny model loops), so usage carries drafting counts to relay
        spec = upstream_localrun(
            host.address,
            free_port(),
            key="remote-key-0001",
            home=home,
            prefix=host.prefix,
            options={"speculative": "ngram"},
        )
        remote = start(spec, logs / "remote.log", wait=False)
        cpp = start(llama_cpp_server(tiny_gguf, free_port(), alias="tiny-cpp"), logs / "llama_cpp.log", wait=False)
        try:
            remote.wait_ready()
            cpp.wait_ready()
            yield {"host": host, "remote": remote, "cpp": cpp}
        finally:
            remote.stop()
            cpp.stop()


@pytest.fixture
def front(engines, front_factory, monkeypatch):
    monkeypatch.setenv("REMOTE_KEY", "remote-key-0001")
    return front_factory(
        [
            {"name": "box2", "url": engines["remote"].url, "kind": "localrun", "key_env": "REMOTE_KEY"},
            {"name": "cpp", "url": engines["cpp"].url, "kind": "openai"},
        ]
    )


def test_models_of_both_engines_are_listed_with_their_source(engines, front):
    assert engines["host"].address.startswith("10.232.") or not engines["host"].isolated
    ids = {m["id"]: m for m in httpx.get(front.url + "/v1/models").json()["data"]}
    assert ids["tiny"]["owned_by"] == "upstream:box2" and ids["tiny"]["upstream"]["health"] == "up"
    assert ids["tiny-cpp"]["owned_by"] == "upstream:cpp"
    listed = {m.model for m in ollama.Client(host=front.url).list().models}
    assert {"tiny:latest", "tiny-cpp:latest"} <= listed  # untagged names carry :latest, as Ollama's do
    names = {m["localrun"]["name"]: m for m in httpx.get(front.url + "/api/tags").json()["models"]}
    assert names["tiny"]["localrun"]["source"] == "upstream box2"
    assert names["tiny-cpp"]["localrun"]["source"] == "upstream cpp"


@pytest.mark.parametrize("model", ["tiny", "tiny-cpp"])
def test_openai_client_chat_completion_and_stream(front, model):
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
    )
    assert out.model == model and out.choices[0].finish_reason in ("length", "stop")
    assert out.usage.completion_tokens >= 1
    # llama_cpp.server sends no usage in a stream (it ignores stream_options): prompt tokens unknown, 0.
    assert out.usage.prompt_tokens >= 1 if model == "tiny" else out.usage.prompt_tokens == 0
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == out.choices[0].message.content  # greedy: the same answer both ways
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    text = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0)
    assert text.choices[0].text and text.usage.completion_tokens >= 1


@pytest.mark.parametrize("model", ["tiny", "tiny-cpp"])
def test_ollama_client_chat_and_stream(front, model):
    client = ollama.Client(host=front.url, timeout=120)
    reply = client.chat(
        model=model, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 6, "temperature": 0}
    )
    assert reply.message.role == "assistant" and reply.done and reply.eval_count >= 1
    parts = list(
        client.chat(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            options={"num_predict": 6, "temperature": 0},
        )
    )
    assert parts[-1].done and "".join(p.message.content for p in parts) == reply.message.content
    gen = client.generate(model=model, prompt="Once upon a time", options={"num_predict": 4, "temperature": 0})
    assert gen.done and gen.response


def test_logprobs_and_json_schema_pass_through_to_localrun_upstream(front):
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        temperature=0,
    )
    content = out.choices[0].logprobs.content
    assert content and all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in content)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "a number"}],
        max_tokens=24,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    assert out.choices[0].message.content.lstrip().startswith("{")


def test_wrong_key_against_the_other_host_names_it(engines, front_factory):
    bad = front_factory(
        [
            {
                "name": "box2",
                "url": engines["remote"].url,
                "kind": "localrun",
                "key": "nope-nope-nope",
                "models": ["tiny"],
            }
        ]
    )
    r = httpx.post(
        bad.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]},
        timeout=60,
    )
    assert r.status_code == 403 and "box2" in r.json()["error"]["message"] and "nope-nope" not in r.text


def test_drafting_counts_of_a_localrun_upstream_reach_the_client(engines, front):
    """The front relays the upstream's usage whole: the drafted and accepted tokens too."""
    body = {"model": "tiny", "prompt": "hello world " * 5, "max_tokens": 24, "temperature": 0}
    direct = httpx.post(
        engines["remote"].url + "/v1/completions",
        json=body,
        headers={"Authorization": "Bearer remote-key-0001"},
        timeout=120,
    ).json()["usage"]
    via = httpx.post(front.url + "/v1/completions", json=body, timeout=120).json()["usage"]
    assert direct["speculative"]["drafted_tokens"] > 0, direct
    assert via["speculative"] == direct["speculative"]
    assert via["completion_tokens_details"] == direct["completion_tokens_details"]
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=body["prompt"],
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.model_extra["speculative"] == direct["speculative"]
