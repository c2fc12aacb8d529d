"""Capabilities end to end on the fake runtime: the official clients against a real server
process. Fast; the same assertions run on llama.cpp in test_llama_server.py."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest

from tests.support.clients import ask, validate

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 2}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def test_json_schema_and_json_object_answers_parse_and_validate(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = ask(oai, "who?", response_format=fmt)
    validate(json.loads(r.choices[0].message.content), PERSON)
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].delta.content or "" for c in ask(oai, "who?", response_format=fmt, stream=True) if c.choices
    )
    assert json.loads(streamed) == json.loads(r.choices[0].message.content)
    obj = json.loads(ask(oai, "anything", response_format={"type": "json_object"}).choices[0].message.content)
    assert isinstance(obj, dict)
    assert ask(oai, "plain", response_format={"type": "text"}).choices[0].message.content.startswith("You said: plain.")
    parsed = oai.completions.create(model="tiny", prompt="x", max_tokens=64, extra_body={}).choices[0].text
    assert not parsed.startswith("{")  # completions have no response_format: unchanged


def test_tool_call_round_trip_non_streaming(oai):
    r = ask(oai, "please call get_weather for Paris", tools=[WEATHER, TIME])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    history = [
        {"role": "user", "content": "please call get_weather for Paris"},
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    again = oai.chat.completions.create(
        model="tiny", messages=history + [{"role": "user", "content": "thanks"}], tools=[WEATHER], max_tokens=8
    )
    assert (
        again.choices[0].message.content.startswith("You said: thanks.") and again.choices[0].finish_reason == "length"
    )
    plain = ask(oai, "no tool needed", tools=[WEATHER])
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content.startswith("You said")


def test_tool_call_streaming_and_forced_choices(oai):
    chunks = list(
        ask(
            oai,
            "hello",
            tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            stream=True,
        )
    )
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    assert len(deltas) == 1 and deltas[0].index == 0 and deltas[0].function.name == "get_time"
    assert json.loads(deltas[0].function.arguments) == {} and deltas[0].id.startswith("call_")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    required = ask(oai, "hello", tools=[WEATHER, TIME], tool_choice="required")
    assert required.choices[0].message.tool_calls[0].function.name == "get_weather"
    none = ask(oai, "call get_weather", tools=[WEATHER], tool_choice="none")
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason != "tool_calls"


def test_logprobs_chat_and_legacy_completions(oai):
    r = ask(oai, "hi there", logprobs=True, top_logprobs=3, max_tokens=6, temperature=0)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3 and bytes(t.bytes).decode() == t.token
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    chunks = list(ask(oai, "hi there", logprobs=True, top_logprobs=1, max_tokens=6, temperature=0, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content] and all(len(t.top_logprobs) == 1 for t in streamed)
    assert ask(oai, "hi", max_tokens=3).choices[0].logprobs is None
    zero = ask(oai, "hi", logprobs=True, max_tokens=3).choices[0].logprobs.content
    assert len(zero) == 3 and all(t.top_logprobs == [] for t in zero)

    legacy = oai.completions.create(model="tiny", prompt="one two", max_tokens=4, logprobs=2, temperature=0)
    lp = legacy.choices[0].logprobs
    assert "".join(lp.tokens) == legacy.choices[0].text and len(lp.token_logprobs) == 4
    assert all(v <= 0 for v in lp.token_logprobs) and all(len(d) == 2 for d in lp.top_logprobs)
    assert lp.text_offset[0] == len("one two") and lp.text_offset[1] == len("one two") + len(lp.tokens[0])
    parts = list(
        oai.completions.create(model="tiny", prompt="one two", max_tokens=4, logprobs=2, temperature=0, stream=True)
    )
    assert [t for p in parts if p.choices[0].logprobs for t in p.choices[0].logprobs.tokens] == lp.tokens


def test_embeddings_dimension_and_determinism(oai):
    a = oai.embeddings.create(model="tiny", input=["alpha", "beta", "alpha"]).data
    assert len(a) == 3 and len(a[0].embedding) == 16 and a[0].embedding == a[2].embedding != a[1].embedding
    assert abs(sum(v * v for v in a[1].embedding) - 1) < 1e-6


def test_requests_that_cannot_be_met_are_400_before_anything_runs(oai):
    cases = [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"functions": [{"name": "f"}], "tools": [WEATHER]}, "functions"),  # legacy and new together
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ]
    for kwargs, field in cases:
        with pytest.raises(openai.BadRequestError) as info:
            ask(oai, "x", **kwargs)
        assert field in info.value.message, (kwargs, info.value.message)


def test_a_schema_without_the_capability_is_refused_by_the_runtime_itself(serve, tiny_gguf):
    """The same server and model, but a runtime that declares only logprobs: the rest is a 400
    naming field and runtime."""
    server = serve(tiny_gguf, "tiny", fake_capabilities=["logprobs"])
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        assert ask(client, "x", logprobs=True, max_tokens=2).choices[0].logprobs.content
        for kwargs, field in (
            ({"tools": [WEATHER]}, "tools"),
            ({"response_format": {"type": "json_object"}}, "response_format"),
            ({"tool_choice": "required", "tools": [WEATHER]}, "tools"),
        ):
            with pytest.raises(openai.BadRequestError) as info:
                ask(client, "x", **kwargs)
            assert (
                field in info.value.message
                and "fake runtime" in info.value.message
                and info.value.body["param"] == field
            )
        history = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ]
        with pytest.raises(openai.BadRequestError, match=r"messages\[0\]"):
            client.chat.completions.create(model="tiny", messages=history)
        with pytest.raises(openai.BadRequestError, match="embeddings|input"):
            client.embeddings.create(model="tiny", input="x")
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=server.url).chat(model="tiny", messages=[{"role": "user", "content": "x"}], format="json")
    assert info.value.status_code == 400 and "format" in info.value.error and "fake" in info.value.error


def test_ollama_format_tools_and_logprobs(server):
    oll = ollama.Client(host=server.url, timeout=30)
    r = oll.chat(model="tiny", messages=[{"role": "user", "content": "x"}], format=PERSON, options={"num_predict": 64})
    validate(json.loads(r.message.content), PERSON)
    j = oll.generate(model="tiny", prompt="x", format="json", options={"num_predict": 64})
    assert isinstance(json.loads(j.response), dict)
    t = oll.chat(
        model="tiny",
        messages=[{"role": "user", "content": "call get_weather"}],
        tools=[WEATHER],
        options={"num_predict": 64},
    )
    (call,) = t.message.tool_calls
    assert (
        call.function.name == "get_weather"
        and call.function.arguments["unit"] == "C"
        and "city" in call.function.arguments
        and t.done_reason == "stop"
    )
    parts = list(
        oll.chat(model="tiny", messages=[{"role": "user", "content": "call get_weather"}], tools=[WEATHER], stream=True)
    )
    assert [c.function.name for p in parts for c in (p.message.tool_calls or ())] == ["get_weather"]
    history = [
        {"role": "user", "content": "call get_weather"},
        t.message.model_dump(exclude_none=True),
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        {"role": "user", "content": "ok"},
    ]
    assert oll.chat(
        model="tiny", messages=history, tools=[WEATHER], options={"num_predict": 4}
    ).message.content.startswith("You said: ok.")
    lp = oll.chat(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        logprobs=True,
        top_logprobs=2,
        options={"num_predict": 5},
    )
    assert len(lp.logprobs) == 5 and all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in lp.logprobs)
    bad = httpx.post(
        f"{server.url}/api/chat",
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "format": "xml"},
    )
    assert bad.status_code == 400 and "format" in bad.json()["error"]
