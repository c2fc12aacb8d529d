"""The Responses API through a real llama.cpp worker: the tiny random GGUF (a grammar makes
even random weights answer validly), through the official ``openai`` client."""

from __future__ import annotations

import json

import pytest

from tests.conftest import needs_llama
from tests.support.clients import client_for, validate
from tests.support.servers import start_in_home

pytestmark = [needs_llama, pytest.mark.llama]

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}
BOUNDED = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "color"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    from tests.factories import write_tiny_llama_gguf

    model = write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny-long") / "tiny-long.gguf", n_ctx_train=4096)
    server = start_in_home(tmp_path_factory.mktemp("resp-llama"), model, "tiny", runtime="", plan={"n_threads": 1})
    yield server
    server.stop()


def test_create_and_stream_agree_on_llama(llama_server):
    with client_for(llama_server, timeout=180) as oai:
        whole = oai.responses.create(model="tiny", input="hello", max_output_tokens=12, temperature=0)
        assert whole.usage.output_tokens >= 1 and whole.usage.input_tokens > 0
        with oai.responses.stream(model="tiny", input="hello", max_output_tokens=12, temperature=0) as stream:
            events = list(stream)
        assert [e.sequence_number for e in events] == list(range(len(events)))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == whole.output_text  # greedy: the same answer
        assert events[-1].type in ("response.completed", "response.incomplete")
        again = oai.responses.create(model="tiny", input="hello", max_output_tokens=2, temperature=0)
        assert again.usage.input_tokens_details.cached_tokens > 0  # the prefix cache answers the repeat


def test_forced_call_and_json_schema_are_valid_by_grammar_on_llama(llama_server):
    with client_for(llama_server, timeout=180) as oai:
        r = oai.responses.create(
            model="tiny",
            input="weather?",
            tools=[WEATHER],
            tool_choice="required",
            temperature=0,
            max_output_tokens=120,
        )
        calls = [o for o in r.output if o.type == "function_call"]
        assert calls and calls[0].name == "get_weather", r.output
        validate(json.loads(calls[0].arguments), WEATHER["parameters"])
        follow = oai.responses.create(
            model="tiny",
            input=[
                {"role": "user", "content": "weather?"},
                calls[0].model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sun"},
            ],
            tools=[WEATHER],
            tool_choice="none",
            max_output_tokens=4,
            temperature=0,
        )
        assert follow.output[0].type == "message"
        fmt = {"format": {"type": "json_schema", "name": "thing", "schema": BOUNDED, "strict": True}}
        r = oai.responses.create(model="tiny", input="a colour as JSON", text=fmt, temperature=0, max_output_tokens=120)
        assert r.status == "completed", r.output_text
        validate(json.loads(r.output_text), BOUNDED)
