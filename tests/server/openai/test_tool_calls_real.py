"""Tool calls that never break, on a real small model through the official openai client:
SmolLM2 135M Instruct sampled at temperature 0.9, under ``tool_choice`` auto and required.

SmolLM2's template has no tool syntax of its own. With ``runtime.tool_fallback = "call_or_reply"``
it answers call-or-reply (localrun/chat/tool_reply.py): the whole answer is one JSON object, a call
held to its schema or a reply, unwrapped before the client sees it. By default (``tagged``) it gets
the Hermes ``<tool_call>`` prompt and, under ``auto``, the lazy grammar: free text until
``<tool_call>``, then only valid calls. Every call that comes back must validate against its
function's schema (jsonschema). A bounded number of tries keeps CI short.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CONVERT = {
    "type": "function",
    "function": {
        "name": "convert_currency",
        "parameters": {
            "type": "object",
            "properties": {"amount": {"type": "number"}, "to": {"type": "string", "enum": ["EUR", "USD"]}},
            "required": ["amount", "to"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CONVERT)}
PROMPTS = ("What's the weather in Oslo?", "Convert 12 dollars to euros.", "Weather in Lima in F please")
#: SmolLM2's pieces of "<tool_call>" ('<', 'tool', '_', 'call', '>'), pushed up: the model opens a call
#: under ``auto`` and keeps wanting to write them inside it, where only the grammar stops it.
PUSH_CALL = {"44": 6, "19324": 6, "79": 6, "4350": 6, "46": 6}


@pytest.fixture(scope="module")
def smol_server(serve_module, smollm2_path):
    return serve_module(smollm2_path, "smol", plan={"n_threads": 2, "n_ctx": 2048}, tool_fallback="call_or_reply")


@pytest.fixture(scope="module")
def smol_tagged(serve_module, smollm2_path):
    """The same model with the old fallback: the Hermes tags and the lazy grammar."""
    return serve_module(smollm2_path, "smol", plan={"n_threads": 2, "n_ctx": 2048}, tool_fallback="tagged")


def answers(server, choice: str, **extra):
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=600)
    for i, prompt in enumerate(PROMPTS):
        r = oai.chat.completions.create(
            model="smol",
            messages=[{"role": "user", "content": prompt}],
            tools=[WEATHER, CONVERT],
            tool_choice=choice,
            parallel_tool_calls=False,
            temperature=0.9,
            seed=i,
            max_tokens=56,
            **extra,
        )
        yield r.choices[0]


def streamed_answers(server, choice: str):
    """The same requests streamed, each folded into (content, [(name, arguments)], finish, content deltas)."""
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=600)
    for i, prompt in enumerate(PROMPTS[:2]):  # two are enough to see the reply stream unwrapped
        stream = oai.chat.completions.create(
            model="smol",
            messages=[{"role": "user", "content": prompt}],
            tools=[WEATHER, CONVERT],
            tool_choice=choice,
            parallel_tool_calls=False,
            temperature=0.9,
            seed=i + 10,
            max_tokens=56,
            stream=True,
        )
        pieces, calls, finish = [], {}, None
        for event in stream:
            for c in event.choices:
                if c.delta.content:
                    pieces.append(c.delta.content)
                for d in c.delta.tool_calls or ():
                    name, args = calls.get(d.index, ("", ""))
                    calls[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
                finish = c.finish_reason or finish
        yield "".join(pieces), list(calls.values()), finish, len(pieces)


def not_wrapper_json(content: str) -> list[str]:
    looks = content.lstrip().startswith("{") or any(k in content for k in ('"response"', '"tool_call'))
    return [f"the wrapper's JSON reached the client: {content!r}"] if looks else []


def check_calls(choices) -> tuple[int, list[str]]:
    calls, broken = 0, []
    for choice in choices:
        content = choice.message.content or ""
        if "<tool_call>" in content:
            broken.append(f"a call reached the client as text: {content!r}")
        for call in choice.message.tool_calls or ():
            calls += 1
            try:
                args = json.loads(call.function.arguments)
                jsonschema.validate(args, SCHEMAS[call.function.name])
            except (ValueError, jsonschema.ValidationError) as exc:
                broken.append(f"{call.function.name}({call.function.arguments}): {exc}")
    return calls, broken


def test_auto_is_a_clean_reply_or_a_valid_call_streamed_or_not(smol_server):
    """Before call-or-reply, SmolLM2 never started a call under ``auto`` (0 of 20 tries)."""
    folded = list(answers(smol_server, "auto"))
    calls, broken = check_calls(folded)
    for choice in folded:
        broken += not_wrapper_json(choice.message.content or "")
        assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)
    for content, streamed, finish, _ in streamed_answers(smol_server, "auto"):
        broken += not_wrapper_json(content)
        for name, arguments in streamed:
            calls += 1
            try:
                jsonschema.validate(json.loads(arguments), SCHEMAS[name])
            except (KeyError, ValueError, jsonschema.ValidationError) as exc:
                broken.append(f"streamed {name}({arguments}): {exc}")
        assert (finish == "tool_calls") == bool(streamed), (content, streamed, finish)
    assert not broken
    assert calls >= 2  # the prompts ask for a function: the model chooses a call from its first token


def test_tagged_fallback_auto_calls_that_start_finish_valid(smol_tagged):
    """Before the lazy grammar, ``auto`` had none: the pushed pieces broke every call."""
    calls, broken = check_calls(answers(smol_tagged, "auto", logit_bias=PUSH_CALL))
    assert not broken
    assert calls >= 1  # pushed, SmolLM2 opens a call in most answers (2 of 3 here)


def test_required_calls_validate_at_temperature_0_9(smol_server):
    calls, broken = check_calls(answers(smol_server, "required"))
    assert not broken
    assert calls == len(PROMPTS)
