# ruff: noqa: F811 - the imported fixture `accepts` is each test's argument
"""The grammar of a chat answer on llama.cpp (runtimes/llamacpp/lazy_grammar.py): lazy tool
grammars per call family, reasoning before a schema or a call.

Checked by llama.cpp's own grammar sampler, byte by byte on the tiny GGUF's vocabulary (256
byte tokens: any text, one byte a token), so each case says exactly which answers the grammar
lets through and which it stops."""

from __future__ import annotations

import json

import pytest

from localrun.types import ChatRequest, Message, Sampling
from tests.conftest import needs_llama
from tests.server.test_reasoning import OPEN_TEMPLATE, THINK_TEMPLATE
from tests.support.grammar import accepts  # noqa: F401 - the fixture

pytestmark = needs_llama

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
PARIS = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
OSLO = {"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}
HERMES_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if tools %}{{ tools | tojson }} answer with <tool_call></tool_call>{% endif %}<|im_start|>assistant\n"
)
MESSAGES = "{% for m in messages %}{{ m.content }}{% endfor %}"
MISTRAL_TEMPLATE = MESSAGES + "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }} [TOOL_CALLS]{% endif %}"
LLAMA3_TEMPLATE = MESSAGES + "{% if tools %}{{ tools | tojson }} ipython <|python_tag|>{% endif %}"
HARMONY_TEMPLATE = MESSAGES + "<|start|>assistant<|channel|>"


def j(obj: object) -> str:
    return json.dumps(obj)


def grammar(
    template: str | None,
    *,
    choice="auto",
    parallel: bool | None = True,
    tools=(WEATHER,),
    fallback: str = "tagged",  # templates without tool syntax: the lazy Hermes tags (call-or-reply: test_reply_grammar)
    **sampling,
) -> str:
    from localrun.runtimes.llamacpp.lazy_grammar import chat_grammar

    req = ChatRequest(
        messages=(Message("user", "x"),),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        sampling=Sampling(**sampling),
    )
    gbnf = chat_grammar(req, template, fallback=fallback)
    assert gbnf is not None
    return gbnf


HERMES_CALL = f"<tool_call>\n{j(PARIS)}\n</tool_call>"


@pytest.mark.parametrize("template", [None, HERMES_TEMPLATE], ids=["fallback", "hermes"])
def test_hermes_auto_is_free_until_the_call_opens_then_only_valid_calls(accepts, template):
    g = grammar(template)
    assert accepts(g, "Sure, I can tell you about the weather.")
    assert accepts(g, "")
    assert accepts(g, "a < b, and <tool is not a call; <<tool_cal")
    assert accepts(g, f"Let me look.\n{HERMES_CALL}")
    assert accepts(g, f"{HERMES_CALL}\n<tool_call>{j(OSLO)}</tool_call>")
    assert not accepts(g, "<tool_call>hello")  # the trigger is a point of no return
    assert not accepts(g, "<tool_call>" + j({"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}))
    assert not accepts(g, "<tool_call>" + j({"name": "nope", "arguments": {}}) + "</tool_call>")
    assert not accepts(g, f"<tool_call>{j(PARIS)}")  # unclosed: the answer cannot end there
    assert not accepts(g, f"{HERMES_CALL} and then some prose")  # after the calls, only the end


def test_parallel_false_or_unset_allows_one_call(accepts):
    assert not accepts(grammar(None, parallel=False), f"{HERMES_CALL}\n{HERMES_CALL}")
    assert not accepts(grammar(None, parallel=None), f"{HERMES_CALL}\n{HERMES_CALL}")
    assert accepts(grammar(None, parallel=False), HERMES_CALL)


def test_required_and_a_named_function_have_no_free_part(accepts):
    g = grammar(None, choice="required", tools=(WEATHER, CLOCK))
    assert accepts(g, HERMES_CALL)
    assert accepts(g, f"<tool_call>{j({'name': 'get_time', 'arguments': {}})}</tool_call>")
    assert not accepts(g, "Sure.")
    assert not accepts(g, "")
    named = grammar(None, choice={"type": "function", "function": {"name": "get_time"}}, tools=(WEATHER, CLOCK))
    assert not accepts(named, HERMES_CALL)


def test_mistral_calls_follow_their_marker_as_one_list(accepts):
    g = grammar(MISTRAL_TEMPLATE)
    assert accepts(g, "The weather:")
    assert accepts(g, f"[TOOL_CALLS][{j(PARIS)}, {j(OSLO)}]")
    assert not accepts(g, "[TOOL_CALLS] I will call it")
    assert not accepts(grammar(MISTRAL_TEMPLATE, parallel=False), f"[TOOL_CALLS][{j(PARIS)}, {j(OSLO)}]")


def test_llama3_calls_are_the_whole_answer_or_follow_the_python_tag(accepts):
    g = grammar(LLAMA3_TEMPLATE)
    call = {"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}
    assert accepts(g, j(call))
    assert accepts(g, f"{j(call)}; {j(call)}")
    assert accepts(g, f"Checking.<|python_tag|>{j(call)}")
    assert accepts(g, "It is sunny today.")
    assert not accepts(g, '{"name": "get_weather", "parameters": {"city": "Rome"}}')  # JSON at the start is a call
    assert not accepts(g, " {broken")


def test_thinking_stays_free_before_a_schema(accepts):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    opened = grammar(OPEN_TEMPLATE, tools=(), json_schema=schema)
    assert accepts(opened, 'Let me think {not json} <think> here.\n</think>\n\n{"ok": true}')
    assert not accepts(opened, '{"ok": true}')  # the prompt opened the block: it must close first
    assert not accepts(opened, 'hmm</think>{"ok": 1}')
    optional = grammar(THINK_TEMPLATE, tools=(), json_schema=schema)
    assert accepts(optional, '<think>free</think>{"ok": false}')
    assert accepts(optional, '{"ok": false}')
    assert not accepts(optional, "no json")


def test_thinking_stays_free_before_tool_calls_and_a_continued_answer_starts_at_the_answer(accepts):
    from localrun.runtimes.llamacpp.lazy_grammar import chat_grammar

    g = grammar(OPEN_TEMPLATE, choice="required")
    assert accepts(g, f"<tool_call> inside reasoning is just text</think>\n{HERMES_CALL}")
    assert not accepts(g, HERMES_CALL)
    # a reasoning budget's continuation: the prefix closed the block, the grammar starts at the answer
    req = ChatRequest(
        messages=(Message("user", "x"),), tools=(WEATHER,), tool_choice="required", prefix="hm\n</think>\n\n"
    )
    continued = chat_grammar(req, OPEN_TEMPLATE, fallback="tagged")
    assert continued is not None and accepts(continued, HERMES_CALL)


def test_gpt_oss_channels_reason_before_the_final_answer(accepts):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    g = grammar(HARMONY_TEMPLATE, tools=(), json_schema=schema)
    assert accepts(
        g, '<|channel|>analysis<|message|>think {freely}<|end|><|start|>assistant<|channel|>final<|message|>{"n": 3}'
    )
    assert accepts(g, '<|channel|>final<|message|>{"n": 3}')
    assert not accepts(g, '<|channel|>final<|message|>{"n": "x"}')


def test_a_raw_grammar_stays_as_sent():
    from localrun.runtimes.llamacpp.lazy_grammar import chat_grammar

    req = ChatRequest(messages=(Message("user", "x"),), sampling=Sampling(grammar='root ::= "a"'))
    assert chat_grammar(req, OPEN_TEMPLATE) == 'root ::= "a"'
