# ruff: noqa: F811 - the imported fixture `accepts` is each test's argument
"""Call or reply (runtimes/llamacpp/reply_grammar.py): for a template without tool syntax the
whole answer is one JSON object, a call held to its tool's schema or a reply string.

Checked by llama.cpp's own grammar engine over SmolLM2's real vocabulary
(tests/support/grammar_match.py: each text tokenized as the model would write it), and byte by
byte on the tiny GGUF's vocabulary where a reasoning template is involved."""

from __future__ import annotations

import json

import pytest

from localrun.types import ChatRequest, Message, Sampling
from tests.conftest import needs_llama
from tests.server.test_reasoning import OPEN_TEMPLATE
from tests.support.grammar import accepts  # noqa: F401 - the fixture

pytestmark = [needs_llama, pytest.mark.llama]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
PARIS = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
OSLO = {"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}


def j(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False)


def grammar(template: str | None = None, *, choice="auto", parallel: bool | None = None, tools=(WEATHER, CLOCK)) -> str:
    from localrun.runtimes.llamacpp.lazy_grammar import chat_grammar

    req = ChatRequest(messages=(Message("user", "x"),), tools=tools, tool_choice=choice, parallel_tool_calls=parallel)
    gbnf = chat_grammar(req, template)
    assert gbnf is not None
    return gbnf


@pytest.fixture(scope="module")
def matcher(smollm2_path):
    from tests.support.grammar_match import GrammarMatcher

    m = GrammarMatcher(smollm2_path)
    yield m
    m.close()


def test_auto_answers_with_a_valid_call_or_a_reply_and_nothing_else(matcher):
    g = grammar()
    assert matcher.parses(g)
    assert matcher.matches(g, j({"tool_call": PARIS}))
    assert matcher.matches(g, '{"tool_call": {"name": "get_time", "arguments": {}}}')
    assert matcher.matches(g, j({"response": 'It is "sunny"\nin Paris — 20 °C 😀'}))
    assert matcher.matches(g, '{"response": "a \\u00e9 \\ud83d\\ude00 \\\\ \\/ \\t"}')
    assert matcher.matches(g, '\n{"response": ""}')
    # The model may stop anywhere in its reply, as in a free one: made to close a JSON string
    # first, SmolLM2 (greedy) wrote on to the length cap and Codex gave up ("Incomplete response").
    assert matcher.matches(g, '{"response": "Hello! How can I help')
    assert not matcher.matches(g, '{"tool_call": {"name": "get_time", "arguments": {}}')  # a call must close
    assert not matcher.matches(g, "It is sunny in Paris.")  # no free text: a call or a reply
    assert not matcher.matches(g, "")
    assert not matcher.matches(g, j({"tool_call": {"name": "get_news", "arguments": {}}}))  # unknown function
    bad_args = {"name": "get_weather", "arguments": {"city": "Paris", "days": 365}}  # maximum 7
    assert not matcher.matches(g, j({"tool_call": bad_args}))
    assert not matcher.matches(g, j({"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}))
    assert not matcher.matches(g, j({"response": 42}))
    assert not matcher.matches(g, '{"response": "raw\nnewline"}')  # JSON strings escape control characters
    assert not matcher.matches(g, j({"response": "ok"}) + " and more")
    assert not matcher.matches(g, j({"tool_calls": [PARIS]}))  # a list only with parallel_tool_calls


def test_parallel_tool_calls_true_is_a_list_false_or_unset_is_one_call(matcher):
    many = grammar(parallel=True)
    assert matcher.matches(many, j({"tool_calls": [PARIS, OSLO]}))
    assert matcher.matches(many, j({"tool_calls": [PARIS]}))
    assert not matcher.matches(many, j({"tool_calls": []}))
    assert not matcher.matches(many, j({"tool_calls": [PARIS, {"name": "get_weather", "arguments": {}}]}))
    assert matcher.matches(many, j({"response": "no call needed"}))
    for parallel in (False, None):
        one = grammar(parallel=parallel)
        assert matcher.matches(one, j({"tool_call": PARIS}))
        assert not matcher.matches(one, j({"tool_calls": [PARIS, OSLO]}))
        assert not matcher.matches(one, '{"tool_call": ' + j(PARIS) + ', "tool_call": ' + j(OSLO) + "}")


def test_required_and_a_named_function_allow_only_the_call_branch(matcher):
    g = grammar(choice="required")
    assert matcher.matches(g, j({"tool_call": PARIS}))
    assert not matcher.matches(g, j({"response": "Sure."}))
    named = grammar(choice={"type": "function", "function": {"name": "get_time"}})
    assert matcher.matches(named, '{"tool_call": {"name": "get_time", "arguments": {}}}')
    assert not matcher.matches(named, j({"tool_call": PARIS}))


def test_the_tagged_fallback_and_templates_with_tool_syntax_keep_their_own_grammar(matcher):
    from localrun.runtimes.llamacpp.lazy_grammar import chat_grammar

    req = ChatRequest(messages=(Message("user", "x"),), tools=(WEATHER,), tool_choice="auto")
    tagged = chat_grammar(req, None, fallback="tagged")
    assert tagged is not None and matcher.matches(tagged, "It is sunny.")
    hermes = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{{ tools|tojson }}<tool_call>{% endif %}"
    native = chat_grammar(req, hermes)
    assert native is not None and matcher.matches(native, "It is sunny.")
    # a request's own JSON schema keeps its grammar: the wrapper is only for free answers with tools
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    with_schema = ChatRequest(messages=(Message("user", "x"),), tools=(WEATHER,), sampling=Sampling(json_schema=schema))
    g = chat_grammar(with_schema, None)
    assert g is not None and matcher.matches(g, '{"ok": true}')


def test_a_reasoning_model_thinks_freely_before_the_wrapper(accepts):
    g = grammar(OPEN_TEMPLATE)
    assert accepts(g, 'free {"not": json} thoughts</think>\n\n' + j({"response": "Done."}))
    assert accepts(g, "hm</think>" + j({"tool_call": PARIS}))
    assert not accepts(g, j({"response": "Done."}))  # the prompt opened the block: it closes first
    assert not accepts(g, "hm</think>The answer is 4.")
