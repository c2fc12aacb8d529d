"""A tool result must answer a call the conversation made, as OpenAI and Anthropic both answer.

Before: an OpenAI ``tool`` message or an Anthropic ``tool_result`` block whose id no earlier
assistant turn had called was a 200, the result rendered as if something had asked for it.
"""

from __future__ import annotations

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _openai(tool_call_id: str) -> dict:
    return {
        "model": "tiny",
        "max_tokens": 2,
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": tool_call_id, "content": "42"},
        ],
    }


def _anthropic(tool_use_id: str) -> dict:
    return {
        "model": "tiny",
        "max_tokens": 2,
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use_id, "content": "42"}]},
        ],
    }


def test_an_openai_tool_message_for_an_unknown_call_id_is_a_400(app_client):
    client = app_client()
    assert client.post("/v1/chat/completions", json=_openai("call_1")).status_code == 200
    r = client.post("/v1/chat/completions", json=_openai("call_unknown"))
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["param"] == "messages[2].tool_call_id" and "call_unknown" in r.text


def test_an_anthropic_tool_result_for_an_unknown_tool_use_id_is_a_400(app_client):
    client = app_client()
    assert client.post("/v1/messages", json=_anthropic("toolu_1")).status_code == 200
    r = client.post("/v1/messages", json=_anthropic("toolu_unknown"))
    assert r.status_code == 400, r.text[:300]
    assert r.json()["type"] == "error" and "toolu_unknown" in r.json()["error"]["message"]
