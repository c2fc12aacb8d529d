# ruff: noqa: F811 - the imported fixture `accepts` is each test's argument
"""Lazy tool grammars in each family's native call syntax (runtimes/llamacpp/native_grammar.py,
localrun/chat/tool_formats.py): free text until the family's trigger under ``auto``, then only
valid calls to the request's tools with arguments that keep their schema; no free text under
``required``; one call unless ``parallel_tool_calls``. Checked by llama.cpp's own grammar
engine over a real vocabulary (tests/support/grammar_match.py)."""

from __future__ import annotations

import json

import pytest

from localrun.chat.tool_triggers import call_syntax
from localrun.errors import UnsupportedFeature
from localrun.types import ChatRequest, Message
from tests.conftest import needs_llama
from tests.support.grammar import accepts  # noqa: F401 - the fixture

pytestmark = needs_llama

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
        },
    },
}
NOTE = {
    "type": "function",
    "function": {
        "name": "take_note",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}
PARIS = ("get_weather", {"city": "Paris", "days": 2})
OSLO = ("get_weather", {"city": "Oslo", "days": 1})
ROME = ("get_weather", {"city": "Rome", "days": 1})  # not in the enum
NO_DAYS = ("get_weather", {"city": "Paris"})  # a required parameter missing
ZERO_DAYS = ("get_weather", {"city": "Paris", "days": 0})  # under the minimum
NOPE = ("nope", {"city": "Paris", "days": 2})  # not a tool of the request


def _template(marks: str) -> str:
    return (
        "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{{ tools | tojson }}" + marks + "{% endif %}"
    )


TEMPLATES = {
    "deepseek": _template("<｜tool▁calls▁begin｜><｜tool▁sep｜>"),
    "kimi": _template("<|tool_calls_section_begin|><|tool_call_begin|>"),
    "granite": _template("<|tool_call|>"),
    "functionary3.1": _template("{{ '<function=' }}x</function>"),
    "functionary3.2": _template(">>>all >>>${recipient}"),
    "gpt-oss": _template("functions.") + "<|start|>assistant<|channel|>",
    "qwen3-coder": _template("<tool_call><function=x><parameter=y>"),
    "glm": _template("<tool_call><arg_key>"),
}


def one(family: str, name: str, args: dict) -> str:
    j = json.dumps(args)
    if family == "deepseek":
        return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{j}\n```<｜tool▁call▁end｜>"
    if family == "kimi":
        return f"<|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>{j}<|tool_call_end|>"
    if family == "functionary3.1":
        return f"<function={name}>{j}</function>"
    if family == "functionary3.2":
        return f"{name}\n{j}"
    if family == "gpt-oss":
        return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{j}"
    if family == "qwen3-coder":
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    if family == "glm":
        params = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items())
        return f"<tool_call>{name}\n{params}</tool_call>"
    raise AssertionError(family)


def calls(family: str, *pairs: tuple[str, dict]) -> str:
    if family == "granite":
        return "<|tool_call|>" + json.dumps([{"name": n, "arguments": a} for n, a in pairs])
    texts = [one(family, n, a) for n, a in pairs]
    if family == "deepseek":
        return "<｜tool▁calls▁begin｜>" + "\n".join(texts) + "<｜tool▁calls▁end｜>"
    if family == "kimi":
        return "<|tool_calls_section_begin|>" + "".join(texts) + "<|tool_calls_section_end|>"
    return (">>>" if family == "functionary3.2" else "\n").join(texts)


def prose(family: str, text: str) -> str:
    """A plain answer in the family's shape."""
    return {"functionary3.2": "all\n", "gpt-oss": "<|channel|>final<|message|>"}.get(family, "") + text


def before(family: str, text: str, tail: str) -> str:
    """Text, then calls."""
    if family == "functionary3.2":
        return f"all\n{text}>>>{tail}"
    if family == "gpt-oss":
        return f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant{tail}"
    return text + tail


def grammar(family: str, *, choice="auto", parallel: bool | None = None, tools=(WEATHER,)) -> str:
    from localrun.runtimes.llamacpp.lazy_grammar import chat_grammar

    req = ChatRequest(messages=(Message("user", "x"),), tools=tools, tool_choice=choice, parallel_tool_calls=parallel)
    gbnf = chat_grammar(req, TEMPLATES[family])
    assert gbnf is not None
    return gbnf


FAMILIES = list(TEMPLATES)


def test_each_template_is_read_as_its_family():
    assert {f: call_syntax(t).family for f, t in TEMPLATES.items()} == {f: f for f in TEMPLATES}


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_is_free_until_the_trigger_then_only_valid_calls(accepts, family):
    g = grammar(family)
    assert accepts(g, calls(family, PARIS))
    assert accepts(g, prose(family, "It is sunny in Paris, <b>really</b>."))
    assert accepts(g, before(family, "Let me check.", calls(family, PARIS)))
    for bad in (NOPE, ROME, NO_DAYS, ZERO_DAYS):
        assert not accepts(g, calls(family, bad)), bad


@pytest.mark.parametrize("family", FAMILIES)
def test_required_has_no_free_text_and_a_named_function_only_its_calls(accepts, family):
    g = grammar(family, choice="required", tools=(WEATHER, NOTE))
    assert accepts(g, calls(family, PARIS))
    assert accepts(g, calls(family, ("take_note", {"text": "milk"})))
    assert not accepts(g, prose(family, "It is sunny."))
    named = grammar(family, choice={"type": "function", "function": {"name": "take_note"}}, tools=(WEATHER, NOTE))
    assert not accepts(named, calls(family, PARIS))


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt-oss"])  # gpt-oss: <|call|> ends the turn
def test_parallel_tool_calls_true_allows_several_false_one(accepts, family):
    assert accepts(grammar(family, parallel=True), calls(family, PARIS, OSLO))
    assert not accepts(grammar(family, parallel=False), calls(family, PARIS, OSLO))
    assert not accepts(grammar(family), calls(family, PARIS, OSLO))


@pytest.mark.parametrize("family", ["qwen3-coder", "glm"])
def test_xml_string_values_are_raw_text_that_cannot_close_their_tag(accepts, family):
    g = grammar(family, tools=(NOTE,))
    assert accepts(g, one(family, "take_note", {"text": 'buy "milk"\nand <eggs>'}))
    closing = "</parameter>" if family == "qwen3-coder" else "</arg_value>"
    assert not accepts(g, one(family, "take_note", {"text": f"a{closing}b"}))


@pytest.mark.parametrize("family", ["qwen3-coder", "glm"])
def test_xml_required_parameters_may_come_in_any_order_but_all_of_them(accepts, family):
    g = grammar(family)
    assert accepts(g, one(family, "get_weather", {"days": 2, "city": "Paris"}))  # as Qwen does, at times
    assert not accepts(g, one(family, "get_weather", {"days": 2}))
    assert not accepts(g, one(family, "get_weather", {"days": 2, "city": "Paris", "extra": 1}))


@pytest.mark.parametrize("family", ["qwen3-coder", "glm"])
def test_xml_refuses_a_string_keyword_raw_text_cannot_keep_by_name(family):
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}},
        },
    }
    with pytest.raises(UnsupportedFeature, match=r"tools\[0\]\.function\.parameters\.properties\.d\.format"):
        grammar(family, tools=(tool,))


def test_gpt_oss_takes_the_recipient_in_the_role_too_and_no_call_inside_the_analysis(accepts):
    g = grammar("gpt-oss")
    assert accepts(g, ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo", "days": 1}')
    assert accepts(
        g,
        "<|channel|>analysis<|message|>I may call to=functions.nope here<|end|><|start|>assistant"
        + calls("gpt-oss", PARIS),
    )
    assert not accepts(g, calls("gpt-oss", PARIS) + "<|channel|>final<|message|>more")


@pytest.fixture(scope="module")
def smol_vocab(smollm2_path):
    from tests.support.grammar_match import GrammarMatcher

    m = GrammarMatcher(smollm2_path)
    yield m
    m.close()


@pytest.mark.llama
@pytest.mark.parametrize("family", FAMILIES)
def test_a_real_vocabularys_multi_byte_tokens_take_the_same_calls(smol_vocab, family):
    """SmolLM2's tokens are multi-byte pieces, not one byte a token: the markers still match."""
    g = grammar(family, choice="required", tools=(WEATHER, NOTE))
    assert smol_vocab.matches(g, calls(family, PARIS))
    assert smol_vocab.matches(g, calls(family, ("take_note", {"text": "buy milk"})))
    assert not smol_vocab.matches(g, calls(family, ROME))


@pytest.fixture(scope="module")
def smol(smollm2_path):
    from tests.support.grammar_match import GrammarMatcher

    m = GrammarMatcher(smollm2_path, load_weights=True)
    yield m
    m.close()


@pytest.mark.llama
@pytest.mark.long  # four generations, 15-40 s each on a shared 2-core machine
# DeepSeek's and Kimi's markers are one token each in their own vocabularies but about 25 of
# SmolLM2's, and a 135M model writes an XML family's raw string on and on: those are left out.
@pytest.mark.parametrize("family", ["granite", "functionary3.1", "functionary3.2", "gpt-oss"])
def test_smollm2_under_required_writes_a_call_that_reads_back_valid(smol, family):
    """A real model sampled hot: whatever it writes in the family's syntax parses back to a
    call that keeps its schema."""
    import jsonschema

    from localrun.chat.tool_calls import parse_tool_calls

    g = grammar(family, choice="required", tools=(WEATHER, NOTE))
    text, done = smol.sample(g, "Call a tool: ", temperature=0.9, seed=3, max_tokens=120)
    if not done:  # out of tokens mid-string (a small model rambles): nothing whole to validate
        pytest.skip(f"{family}: no end within 120 tokens: {text!r}")
    params = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, NOTE)}
    _, found = parse_tool_calls(text, tuple(params), family, params)
    assert len(found) == 1, text
    fn = found[0]["function"]
    jsonschema.validate(json.loads(fn["arguments"]), params[fn["name"]])
