"""Thinking and schemas together on a real llama.cpp worker: the tiny random GGUF with a
template whose generation prompt opens ``<think>`` (DeepSeek-R1 style). Random weights never
close the block themselves, so a reasoning budget closes it; the reasoning before is free text
and the schema (Responses ``text.format``) or the forced call (Anthropic tools) holds after it.

Before the grammar started after the reasoning, it held from the first token: the JSON was
written inside the reasoning block and the answer came back empty."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import needs_llama
from tests.server.test_reasoning import OPEN_TEMPLATE
from tests.support.clients import anthropic_client

pytestmark = [needs_llama, pytest.mark.llama]
anthropic = pytest.importorskip("anthropic")
jsonschema = pytest.importorskip("jsonschema")

COLOUR = {
    "type": "object",
    "properties": {"name": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}
LEVEL = {
    "name": "set_level",
    "input_schema": {"type": "object", "properties": {"level": {"enum": [1, 2, 3]}}, "required": ["level"]},
}


@pytest.fixture(scope="module")
def r1_server(serve_module, tmp_path_factory):
    from tests.factories import write_tiny_llama_gguf

    path = write_tiny_llama_gguf(
        tmp_path_factory.mktemp("r1") / "tiny-r1.gguf", chat_template=OPEN_TEMPLATE, n_ctx_train=2048
    )
    return serve_module(path, "r1", plan={"n_threads": 1, "n_ctx": 2048})


def test_responses_reason_freely_then_answer_by_the_schema(r1_server):
    oai = openai.OpenAI(base_url=f"{r1_server.url}/v1", api_key="x", max_retries=0, timeout=300)
    fmt = {"format": {"type": "json_schema", "name": "colour", "schema": COLOUR, "strict": True}}
    r = oai.responses.create(
        model="r1", input="a colour", text=fmt, reasoning={"effort": "minimal"}, temperature=0.9, max_output_tokens=400
    )
    kinds = [item.type for item in r.output]
    assert kinds[0] == "reasoning" and "message" in kinds, kinds
    reasoning = json.dumps(r.output[0].model_dump())
    assert '"name"' not in reasoning  # the reasoning was free, not the schema's JSON
    jsonschema.validate(json.loads(r.output_text), COLOUR)


def test_anthropic_thinks_then_calls_by_the_grammar(r1_server):
    with anthropic_client(r1_server, timeout=300) as claude:
        r = claude.messages.create(
            model="r1",
            max_tokens=200,
            messages=[{"role": "user", "content": "set it"}],
            tools=[LEVEL],
            tool_choice={"type": "tool", "name": "set_level", "disable_parallel_tool_use": True},
            thinking={"type": "enabled", "budget_tokens": 8},
            extra_body={"temperature": 0.9},
        )
    kinds = [b.type for b in r.content]
    assert kinds == ["thinking", "tool_use"], r.content
    jsonschema.validate(r.content[1].input, LEVEL["input_schema"])
