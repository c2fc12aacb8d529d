# ruff: noqa: F811 - the imported fixture `accepts` is each test's argument
"""The real chat templates of llama.cpp's corpus (``models/templates`` in the llama-cpp-python
sdist, about 70) × the tool-call formats: each renders a request with tools (the template's
own ``tools`` or our fallback block), and hand-written outputs in its family's documented
format parse back to the same calls, drifted ones included (prose around the call, a missing
closing tag, two calls, a call mentioned inside the reasoning). For each template the lazy
grammar is built and llama.cpp accepts the family's clean output with it.

The templates are read where scripts/build-llama-server unpacks the sdist (the test cache), or
from ``LOCALRUN_TEMPLATE_DIR``; without them the tests skip, saying so."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from localrun.chat import tool_reply
from localrun.chat import tools as tc
from localrun.chat.reasoning import detect_format
from localrun.chat.template import render_chat
from localrun.chat.tool_triggers import call_syntax
from localrun.errors import TemplateError
from localrun.types import ChatRequest, Message
from tests.conftest import GEMMA_CACHE, needs_llama
from tests.support.grammar import accepts  # noqa: F401 - the fixture


def template_dir() -> Path | None:
    given = os.environ.get("LOCALRUN_TEMPLATE_DIR")
    if given:
        return Path(given)
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None
    found = GEMMA_CACHE / f"llama.cpp-{version}" / "src" / "vendor" / "llama.cpp" / "models" / "templates"
    return found if found.is_dir() else None


DIR = template_dir()
TEMPLATES = sorted(DIR.glob("*.jinja")) if DIR else []
pytestmark = pytest.mark.skipif(
    not TEMPLATES,
    reason="llama.cpp's template corpus is not here: run scripts/build-llama-server (it unpacks the "
    "llama-cpp-python sdist into the test cache) or set LOCALRUN_TEMPLATE_DIR",
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NAMES = ("get_weather",)
PARIS, OSLO = {"city": "Paris"}, {"city": "Oslo"}


def hermes(args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": args}) + "\n</tool_call>"


def body(args: dict, key: str = "arguments") -> str:
    return json.dumps({"name": "get_weather", key: args})


#: family -> (label, recorded output, the arguments of each call it holds)
RECORDED: dict[str, list[tuple[str, str, list[dict]]]] = {
    "hermes": [
        ("clean", hermes(PARIS), [PARIS]),
        ("prose around", f"Let me check that.\n{hermes(PARIS)}", [PARIS]),
        ("no closing tag", hermes(PARIS).removesuffix("\n</tool_call>"), [PARIS]),
        ("two calls", f"{hermes(PARIS)}\n{hermes(OSLO)}", [PARIS, OSLO]),
        ("cut short in the second call", f'{hermes(PARIS)}\n<tool_call>\n{{"name": "get_wea', [PARIS]),
        (
            "function tag inside",
            '<tool_call>\n<function=get_weather>{"city": "Paris"}</function>\n</tool_call>',
            [PARIS],
        ),
    ],
    "mistral": [
        ("clean", f"[TOOL_CALLS][{body(PARIS)}]", [PARIS]),
        ("prose before", f"Sure.[TOOL_CALLS][{body(PARIS)}]", [PARIS]),
        ("two calls", f"[TOOL_CALLS][{body(PARIS)}, {body(OSLO)}]", [PARIS, OSLO]),
        ("name[ARGS] form", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', [PARIS]),
    ],
    "llama3": [
        ("clean", body(PARIS, "parameters"), [PARIS]),
        ("python tag", "<|python_tag|>" + body(PARIS, "parameters"), [PARIS]),
        ("two calls", body(PARIS, "parameters") + "; " + body(OSLO, "parameters"), [PARIS, OSLO]),
        ("prose then tag", "Checking.<|python_tag|>" + body(OSLO, "parameters"), [OSLO]),
    ],
    "json": [
        ("clean", body(PARIS), [PARIS]),
        ("code fence", f"```json\n{body(PARIS)}\n```", [PARIS]),
        ("a list of two", f"[{body(PARIS)}, {body(OSLO)}]", [PARIS, OSLO]),
    ],
}
CASES = [
    pytest.param(path, label, text, args, id=f"{path.stem}-{label}")
    for path in TEMPLATES
    for label, text, args in RECORDED[call_syntax(path.read_text()).family]
]
REASONING = [path for path in TEMPLATES if (fmt := detect_format(path.read_text())) and fmt.name == "think"]


def test_the_corpus_is_the_real_one():
    assert len(TEMPLATES) >= 60
    families = {call_syntax(p.read_text()).family for p in TEMPLATES}
    assert families == {"hermes", "mistral", "llama3", "json"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_tools_render_into_every_template(path):
    template = path.read_text()
    req = ChatRequest(
        messages=(Message("user", "What is the weather in Paris?"),), tools=(WEATHER,), tool_choice="auto"
    )
    messages, variables = tc.prompt_messages(req, template)
    try:
        text = render_chat(template, messages, variables=variables)
    except TemplateError as exc:  # a template that needs more than a user turn and tools (a system turn, 'functions')
        pytest.skip(f"{path.stem} does not render this conversation: {exc}")
    assert "get_weather" in text, "the tool never reached the prompt"


@pytest.mark.parametrize(("path", "label", "text", "args"), CASES)
def test_recorded_outputs_parse_in_the_templates_family(path, label, text, args):
    content, calls = tc.parse_tool_calls(text, NAMES)
    assert [json.loads(c["function"]["arguments"]) for c in calls] == args
    assert "get_weather" not in content


@pytest.mark.parametrize("path", REASONING, ids=lambda p: p.stem)
def test_a_call_mentioned_inside_the_reasoning_is_not_a_call(path):
    text = f"<think>Maybe {hermes(OSLO)}? No, Paris.</think>\n\n{hermes(PARIS)}"
    content, calls = tc.parse_tool_calls(text, NAMES)
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [PARIS]
    assert content.startswith("<think>Maybe <tool_call>")  # the reasoning is kept whole for the splitter
    opened = f"Maybe {hermes(OSLO)}? No.</think>\n{hermes(PARIS)}"  # the prompt opened the block
    assert [json.loads(c["function"]["arguments"]) for c in tc.parse_tool_calls(opened, NAMES)[1]] == [PARIS]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
@needs_llama
def test_the_lazy_grammar_builds_and_takes_the_familys_clean_call(path, accepts):
    from localrun.runtimes.llamacpp.lazy_grammar import chat_grammar

    template = path.read_text()
    req = ChatRequest(messages=(Message("user", "x"),), tools=(WEATHER,), tool_choice="auto")
    gbnf = chat_grammar(req, template)
    if gbnf is None:
        pytest.skip(f"{path.stem}: no tool grammar for this template's format")
    clean = RECORDED[call_syntax(template).family][0][1]
    if tool_reply.applies(req, template):  # no tool syntax at all: the whole answer is a call or a reply
        clean = json.dumps({"tool_call": {"name": "get_weather", "arguments": PARIS}})
    fmt = detect_format(template)
    if fmt is not None and fmt.name == "think":
        clean = ("" if fmt.open_at_start else "<think>") + "thinking</think>\n" + clean
    assert accepts(gbnf, clean.replace("\n</tool_call>", "</tool_call>"))
