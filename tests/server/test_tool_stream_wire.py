"""Streamed tool calls in every API's own event shape, on the fake runtime (fast): its call for
``call get_weather`` is a Hermes ``<tool_call>`` written a word per token, so the arguments
come in several pieces.

Before: every API sent each call whole after the answer ended (one ``tool_calls`` delta with the
whole arguments, one ``input_json_delta``, one ``function_call_arguments.delta``)."""

from __future__ import annotations

import json

import pytest

from tests.server.test_openapi_streams import _check, _events

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["C", "F"]}},
}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}
BELOW_ZERO = {
    "type": "function",
    "function": {
        "name": "set_level",
        "parameters": {
            "type": "object",
            "properties": {"level": {"type": "integer", "maximum": -1}},
            "required": ["level"],
        },
    },
}
ASK = [{"role": "user", "content": "call get_weather"}]
#: What the fake runtime writes: the smallest instance of PARAMS, in json.dumps's spacing.
ARGS = '{"city": "", "days": 0, "unit": "C"}'
STREAMING = ["tools", "grammar"]  # a runtime whose grammar holds calls valid: deltas go out as they come


def _data(r) -> list[dict]:
    return [json.loads(e["data"]) for e in _events(r.text) if e.get("data") not in (None, "[DONE]")]


def openai_stream(client, **extra) -> list[dict]:
    body = {"model": "tiny", "messages": ASK, "tools": [TOOL], "stream": True, "max_tokens": 60, **extra}
    return _data(client.post("/v1/chat/completions", json=body))


def test_openai_chat_streams_the_arguments_piece_by_piece(app_client):
    events = openai_stream(app_client(capabilities=STREAMING))
    deltas = [c for e in events for c in (e["choices"][0]["delta"].get("tool_calls") or [])]
    first, rest = deltas[0], deltas[1:]
    assert first["index"] == 0 and first["type"] == "function" and first["id"].startswith("call_")
    assert first["function"]["name"] == "get_weather" and first["function"]["arguments"] == ""
    assert len(rest) > 2 and all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in rest)
    assert "".join(d["function"]["arguments"] for d in deltas) == ARGS
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_runtime_without_grammar_sends_each_call_once_it_validated(app_client):
    """No grammar: the call is held until it ended and passed its schema, then sent in one delta."""
    events = openai_stream(app_client(capabilities=["tools"]))
    deltas = [c for e in events for c in (e["choices"][0]["delta"].get("tool_calls") or [])]
    assert len(deltas) == 1 and deltas[0]["function"] == {"name": "get_weather", "arguments": ARGS}


def test_a_call_that_breaks_its_schema_ends_the_stream_with_an_error(app_client):
    client = app_client(capabilities=STREAMING)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "call set_level"}], "tools": [BELOW_ZERO]}
    events = _data(client.post("/v1/chat/completions", json={**body, "stream": True, "max_tokens": 60}))
    assert "breaks its schema" in events[-1]["error"]["message"]
    assert not any(e.get("choices") and e["choices"][0]["finish_reason"] == "tool_calls" for e in events)


def test_a_call_the_length_limit_cuts_is_an_error_not_a_call(app_client):
    events = openai_stream(app_client(capabilities=STREAMING), max_tokens=5)
    assert any(e.get("choices") and e["choices"][0]["delta"].get("tool_calls") for e in events)  # it started
    assert events[-1]["error"]["code"] == "invalid_model_output" and "max_tokens" in events[-1]["error"]["message"]


def test_legacy_functions_stream_the_name_then_the_arguments(app_client):
    client = app_client(capabilities=STREAMING)
    body = {"model": "tiny", "messages": ASK, "functions": [TOOL["function"]], "stream": True, "max_tokens": 60}
    events = _data(client.post("/v1/chat/completions", json=body))
    calls = [e["choices"][0]["delta"]["function_call"] for e in events if "function_call" in e["choices"][0]["delta"]]
    assert calls[0] == {"name": "get_weather", "arguments": ""} and len(calls) > 2
    assert "".join(c["arguments"] for c in calls) == ARGS


def test_anthropic_streams_input_json_deltas(app_client):
    client = app_client(capabilities=STREAMING)
    tools = [{"name": "get_weather", "input_schema": PARAMS}]
    body = {"model": "tiny", "max_tokens": 60, "messages": ASK, "tools": tools, "stream": True}
    events = _data(client.post("/v1/messages", json=body))
    kinds = [e["type"] for e in events]
    start = kinds.index("content_block_start")
    block = events[start]["content_block"]
    assert block["type"] == "tool_use" and block["name"] == "get_weather" and block["input"] == {}
    pieces = [e["delta"]["partial_json"] for e in events if e.get("delta", {}).get("type") == "input_json_delta"]
    assert len(pieces) > 2 and "".join(pieces) == ARGS
    assert kinds[start:] == [
        "content_block_start",
        *["content_block_delta"] * len(pieces),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_responses_streams_function_call_arguments(app_client):
    client = app_client(capabilities=STREAMING)
    tools = [{"type": "function", "name": "get_weather", "parameters": PARAMS}]
    body = {"model": "tiny", "input": "call get_weather", "tools": tools, "stream": True, "max_output_tokens": 60}
    events = _data(client.post("/v1/responses", json=body))
    kinds = [e["type"] for e in events]
    added = kinds.index("response.output_item.added")
    assert events[added]["item"]["type"] == "function_call" and events[added]["item"]["arguments"] == ""
    pieces = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(pieces) > 2 and "".join(pieces) == ARGS
    assert kinds[added:] == [
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * len(pieces),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (call,) = events[-1]["response"]["output"]
    assert call["arguments"] == ARGS and call["status"] == "completed"


def test_ollama_sends_each_call_whole_as_soon_as_it_ends(app_client):
    client = app_client(capabilities=STREAMING)
    r = client.post("/api/chat", json={"model": "tiny", "messages": ASK, "tools": [TOOL], "stream": True})
    lines = [json.loads(line) for line in r.text.splitlines()]
    with_calls = [i for i, line in enumerate(lines) if line.get("message", {}).get("tool_calls")]
    assert len(with_calls) == 1 and not lines[with_calls[0]]["done"] and lines[-1]["done"]
    (call,) = lines[with_calls[0]]["message"]["tool_calls"]
    assert call["function"] == {"index": 0, "name": "get_weather", "arguments": json.loads(ARGS)}


TOOL_STREAMS = {
    "/v1/chat/completions": {"model": "tiny", "messages": ASK, "tools": [TOOL], "max_tokens": 60, "stream": True},
    "/v1/messages": {
        "model": "tiny",
        "messages": ASK,
        "tools": [{"name": "get_weather", "input_schema": PARAMS}],
        "max_tokens": 60,
        "stream": True,
    },
    "/v1/responses": {
        "model": "tiny",
        "input": "call get_weather",
        "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS}],
        "max_output_tokens": 60,
        "stream": True,
    },
}


@pytest.mark.parametrize("path", sorted(TOOL_STREAMS))
def test_a_streamed_call_matches_the_documented_events(app_client, path):
    client = app_client(capabilities=STREAMING)
    document = client.get("/openapi.json").json()
    schema = document["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]["itemSchema"]
    events = _events(client.post(path, json=TOOL_STREAMS[path]).text)
    assert len(events) > 5
    for event in events:
        _check(schema, event)
