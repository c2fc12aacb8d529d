"""Every route through an upstream: embeddings, tools, JSON schemas, logprobs, /api/show, the
name rules with a local model of the same name, and upstream refusals mapped to 400s.

The upstream is a real localrun server; its fake runtime declares the capabilities a test
needs, so the answers are known (the real engines are in test_real_engines.py / test_vllm.py).
"""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.fixture
def capable(fake_upstream, front_factory):
    up = fake_upstream(fake_capabilities=["tools", "json_schema", "logprobs", "embeddings"])
    return up, front_factory([{"name": "box2", "url": up.url, "kind": "localrun"}])


def _oa(front) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_embeddings_match_the_upstreams_own(capable):
    up, front = capable
    via = _oa(front).embeddings.create(model="tiny", input=["a", "b"])
    direct = openai.OpenAI(base_url=up.url + "/v1", api_key="x").embeddings.create(model="tiny", input=["a", "b"])
    assert [d.embedding for d in via.data] == [d.embedding for d in direct.data] and via.model == "tiny"
    assert via.usage.prompt_tokens == direct.usage.prompt_tokens > 0  # the upstream's own count, passed on
    emb = ollama.Client(host=front.url).embed(model="tiny", input="a")
    assert emb.prompt_eval_count > 0
    assert emb.embeddings[0] == pytest.approx(direct.data[0].embedding, rel=1e-6)  # /api/embed rounds to float32


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_come_back_through_localrun(capable, stream):
    _, front = capable
    msgs = [{"role": "user", "content": "call get_weather"}]
    if not stream:
        out = _oa(front).chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
        calls = out.choices[0].message.tool_calls
        assert out.choices[0].finish_reason == "tool_calls"
    else:
        chunks = list(_oa(front).chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, stream=True))
        deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
        calls = deltas
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert calls[0].function.name == "get_weather" and "city" in json.loads(calls[0].function.arguments)
    history = msgs + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]
    follow = _oa(front).chat.completions.create(model="tiny", messages=history, tools=TOOLS)
    assert follow.choices[0].message.content.startswith("You said: thanks")  # the tool turns went up and were read


def test_json_schema_and_logprobs_pass_through(capable):
    _, front = capable
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    out = _oa(front).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    )
    assert json.loads(out.choices[0].message.content) == {"n": 0}
    out = _oa(front).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4, logprobs=True, top_logprobs=2
    )
    entries = out.choices[0].logprobs.content
    assert len(entries) >= 1 and all(len(e.top_logprobs) == 2 and e.logprob < 0 for e in entries)
    text = _oa(front).completions.create(model="tiny", prompt="hello", max_tokens=4, logprobs=1)
    assert text.choices[0].logprobs.tokens and len(text.choices[0].logprobs.top_logprobs[0]) == 1


def test_an_upstream_runtime_that_refuses_a_field_is_a_400_naming_both(fake_upstream, front_factory):
    up = fake_upstream()  # its fake runtime declares embeddings only
    front = front_factory([{"name": "box2", "url": up.url, "kind": "localrun"}])
    r = httpx.post(
        front.url + "/v1/chat/completions",
        timeout=30,
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS},
    )
    err = r.json()["error"]
    assert r.status_code == 400 and "box2" in err["message"] and "'tools'" in err["message"]


def test_local_and_upstream_of_one_name_are_both_reachable(fake_upstream, front_factory):
    up = fake_upstream()
    front = front_factory([{"name": "box2", "url": up.url, "kind": "localrun"}], local=("tiny",))
    ids = [m["id"] for m in httpx.get(front.url + "/v1/models").json()["data"]]
    assert ids.count("tiny") == 1 and "box2/tiny" in ids
    local = _oa(front).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3)
    remote = _oa(front).chat.completions.create(
        model="box2/tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3
    )
    assert local.model == "tiny" and remote.model == "box2/tiny"
    assert front.pool.get("box2").sent == 1  # only the prefixed name went upstream
    show = httpx.post(front.url + "/api/show", json={"model": "box2/tiny"}).json()
    assert show["localrun"]["source"] == "upstream" and show["details"]["format"] == "remote"
    r = httpx.post(
        front.url + "/v1/chat/completions", json={"model": "box3/tiny", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 404
