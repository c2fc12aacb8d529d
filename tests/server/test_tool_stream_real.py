"""Streamed tool calls on a real small model (SmolLM2 135M Instruct on llama.cpp) through the
official clients, one server for the module: the arguments arrive as deltas while the model
writes them, and what the clients accumulate is the call, valid against its schema.

SmolLM2's template has no tool syntax: it gets the fallback prompt (Hermes ``<tool_call>``),
``tool_choice`` "required" (Anthropic's ``any``) makes it call, and the grammar holds the call
valid, so the deltas go out as they come. Ollama's API has no ``tool_choice``: a conversation in
which the assistant called the tool for the same kind of question makes it call again
(temperature 0; with a tool result in between, SmolLM2 writes a ``<tool_response>`` instead).

Before: each API sent the call whole after the answer ended (one arguments piece).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import needs_llama
from tests.support.clients import anthropic_client, client_for

pytestmark = [needs_llama, pytest.mark.llama]
jsonschema = pytest.importorskip("jsonschema")

PARAMS = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather forecast", "parameters": PARAMS},
}
ASK = [{"role": "user", "content": "What's the weather in Oslo for the next 3 days?"}]


@pytest.fixture(scope="module")
def smol(serve_module, smollm2_path):
    return serve_module(smollm2_path, "smol", plan={"n_threads": 2, "n_ctx": 2048})


def test_openai_chat_arguments_arrive_in_pieces(smol):
    oai = client_for(smol, timeout=300)
    stream = oai.chat.completions.create(
        model="smol", messages=ASK, tools=[WEATHER], tool_choice="required", stream=True, temperature=0, max_tokens=40
    )
    pieces, names, finish = [], [], None
    for chunk in stream:
        choice = chunk.choices[0]
        for call in choice.delta.tool_calls or ():
            assert call.index == 0
            if call.function.name:
                names.append(call.function.name)
            if call.function.arguments:
                pieces.append(call.function.arguments)
        finish = choice.finish_reason or finish
    assert names == ["get_weather"] and finish == "tool_calls"
    assert len(pieces) > 1  # deltas, not the whole object at the end
    jsonschema.validate(json.loads("".join(pieces)), PARAMS)


def test_anthropic_sdk_accumulates_the_input_json_deltas(smol):
    with anthropic_client(smol, timeout=300) as claude:
        with claude.messages.stream(
            model="smol",
            max_tokens=40,
            messages=ASK,
            tools=[{"name": "get_weather", "input_schema": PARAMS}],
            tool_choice={"type": "any"},
            extra_body={"temperature": 0},  # (this SDK's stream() takes no temperature of its own)
        ) as stream:
            partial = [
                e.delta.partial_json
                for e in stream
                if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
            ]
            final = stream.get_final_message()
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert len(partial) > 1 and block.input == json.loads("".join(partial))
    jsonschema.validate(block.input, PARAMS)


def test_responses_stream_function_call_arguments_delta(smol):
    oai = client_for(smol, timeout=300)
    tool = {"type": "function", "name": "get_weather", "parameters": PARAMS}
    events = list(
        oai.responses.create(
            model="smol",
            input=ASK[0]["content"],
            tools=[tool],
            tool_choice="required",
            stream=True,
            temperature=0,
            max_output_tokens=40,
        )
    )
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(deltas) > 1 and "".join(deltas) == done.arguments
    (item,) = [i for i in events[-1].response.output if i.type == "function_call"]
    assert item.arguments == done.arguments
    jsonschema.validate(json.loads(done.arguments), PARAMS)


def test_ollama_client_gets_the_call_in_the_stream(smol):
    ollama = pytest.importorskip("ollama")
    called = {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
    history = [
        {"role": "user", "content": "Weather in Paris for 2 days?"},
        {"role": "assistant", "content": "", "tool_calls": [called]},
    ]
    client = ollama.Client(host=smol.url, timeout=300)
    lines = list(
        client.chat(
            model="smol",
            messages=[*history, {"role": "user", "content": "Weather in Oslo for 3 days?"}],
            tools=[WEATHER],
            stream=True,
            options={"temperature": 0, "num_predict": 40},
        )
    )
    calls = [(i, c) for i, line in enumerate(lines) for c in (line.message.tool_calls or ())]
    assert len(calls) == 1, [line.message.content for line in lines]
    at, call = calls[0]
    assert at < len(lines) - 1 and lines[-1].done  # in a line of its own, before the last
    assert call.function.name == "get_weather"
    jsonschema.validate(dict(call.function.arguments), PARAMS)
