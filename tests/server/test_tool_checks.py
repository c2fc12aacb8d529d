"""Tool calls checked against their schema after the fact (localrun/chat/tool_checks.py): a
runtime that parses calls after the model wrote them (here the fake runtime, whose call for
``{"type": "integer", "maximum": -1}`` is 0) must not hand the app a call that breaks its
schema; each API answers its own error shape instead, naming the argument."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from localrun.chat.tool_checks import call_problems
from tests.support.clients import anthropic_client, client_for

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
GOOD = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo"]}}, "required": ["city"]},
    },
}


def call(name: str, arguments: str) -> dict:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_problems_are_named_by_call_and_argument():
    tools = (BELOW_ZERO, GOOD)
    assert call_problems([call("get_weather", '{"city": "Oslo"}')], tools) == []
    (problem,) = call_problems([call("set_level", '{"level": 3}')], tools)
    assert "set_level" in problem and "level" in problem and "-1" in problem
    assert "not JSON" in call_problems([call("get_weather", '{"city": ')], tools)[0]
    assert "not among" in call_problems([call("nope", "{}")], tools)[0]
    broken_schema = {"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}
    assert (
        call_problems([call("f", "{}")], (broken_schema,)) == []
    )  # the request's own bad schema: not the model's fault


@pytest.fixture
def server(serve, tiny_gguf):
    return serve(tiny_gguf, "tiny", fake_capabilities=["tools"])


def test_every_api_refuses_a_call_that_breaks_its_schema(server):
    with client_for(server, timeout=30) as oai:
        ok = oai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "call get_weather"}], tools=[GOOD], max_tokens=30
        )
        assert ok.choices[0].message.tool_calls[0].function.arguments == '{"city": "Oslo"}'
        with pytest.raises(openai.InternalServerError) as info:
            oai.with_options(max_retries=0).chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "call set_level"}],
                tools=[BELOW_ZERO],
                max_tokens=30,
            )
        assert "breaks its schema" in str(info.value) and "level" in str(info.value)
        with pytest.raises(openai.APIError, match="breaks its schema"):  # before or inside the stream
            for chunk in oai.with_options(max_retries=0).chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "call set_level"}],
                tools=[BELOW_ZERO],
                max_tokens=30,
                stream=True,
            ):
                assert not (chunk.choices and chunk.choices[0].delta.tool_calls)  # no broken call goes out first
    with anthropic_client(server) as claude, pytest.raises(anthropic.InternalServerError) as info:
        claude.messages.create(
            model="tiny",
            max_tokens=30,
            messages=[{"role": "user", "content": "call set_level"}],
            tools=[{"name": "set_level", "input_schema": BELOW_ZERO["function"]["parameters"]}],
        )
    assert "breaks its schema" in str(info.value)
    r = httpx.post(
        f"{server.url}/api/chat",
        json={
            "model": "tiny",
            "stream": False,
            "messages": [{"role": "user", "content": "call set_level"}],
            "tools": [BELOW_ZERO],
        },
        timeout=30,
    )
    assert r.status_code == 500 and "breaks its schema" in r.json()["error"]
