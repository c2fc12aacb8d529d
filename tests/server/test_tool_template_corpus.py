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
from localrun.chat.tool_formats import NATIVE_FAMILIES
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


def ds(args: dict) -> str:
    return (
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{json.dumps(args)}\n```<｜tool▁call▁end｜>"
    )


def kimi(args: dict, i: int = 0) -> str:
    return (
        f"<|tool_call_begin|>functions.get_weather:{i}<|tool_call_argument_begin|>{json.dumps(args)}<|tool_call_end|>"
    )


def fn31(args: dict) -> str:
    return f"<function=get_weather>{json.dumps(args)}</function>"


def harmony(args: dict) -> str:
    return f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{json.dumps(args)}<|call|>"


def qwen_xml(args: dict) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function=get_weather>\n{params}</function>\n</tool_call>"


def glm(args: dict) -> str:
    params = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items())
    return f"<tool_call>get_weather\n{params}</tool_call>"


DS_OPEN, DS_CLOSE = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
KIMI_OPEN, KIMI_CLOSE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"
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
    "deepseek": [
        ("clean", DS_OPEN + ds(PARIS) + DS_CLOSE, [PARIS]),
        ("prose before", f"Let me check.\n\n{DS_OPEN}{ds(PARIS)}{DS_CLOSE}", [PARIS]),
        ("two calls", f"{DS_OPEN}{ds(PARIS)}\n{ds(OSLO)}{DS_CLOSE}", [PARIS, OSLO]),
        ("no closing markers", DS_OPEN + ds(PARIS).removesuffix("<｜tool▁call▁end｜>"), [PARIS]),
        (
            "V3.1 form",
            f'{DS_OPEN}<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{{"city": "Paris"}}<｜tool▁call▁end｜>',
            [PARIS],
        ),
        ("inside the reasoning", f"<think>Maybe {DS_OPEN}{ds(OSLO)}{DS_CLOSE}?</think>\n{DS_OPEN}{ds(PARIS)}", [PARIS]),
        (
            "cut short in the second call",
            f"{DS_OPEN}{ds(PARIS)}<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_w",
            [PARIS],
        ),
    ],
    "kimi": [
        ("clean", KIMI_OPEN + kimi(PARIS) + KIMI_CLOSE, [PARIS]),
        ("prose before", f"I will look it up. {KIMI_OPEN}{kimi(PARIS)}{KIMI_CLOSE}", [PARIS]),
        ("two calls", KIMI_OPEN + kimi(PARIS) + kimi(OSLO, 1) + KIMI_CLOSE, [PARIS, OSLO]),
        ("no closing markers", KIMI_OPEN + kimi(PARIS).removesuffix("<|tool_call_end|>"), [PARIS]),
        (
            "inside the reasoning",
            f"<think>{KIMI_OPEN}{kimi(OSLO)}</think>{KIMI_OPEN}{kimi(PARIS)}{KIMI_CLOSE}",
            [PARIS],
        ),
    ],
    "granite": [
        ("clean", f"<|tool_call|>[{body(PARIS)}]", [PARIS]),
        ("prose before", f"Sure.<|tool_call|>[{body(PARIS)}]", [PARIS]),
        ("two calls", f"<|tool_call|>[{body(PARIS)}, {body(OSLO)}]", [PARIS, OSLO]),
        ("one object, no list", f"<|tool_call|>{body(PARIS)}", [PARIS]),
    ],
    "functionary3.1": [
        ("clean", fn31(PARIS), [PARIS]),
        ("prose before", f"Checking. {fn31(PARIS)}", [PARIS]),
        ("two calls", fn31(PARIS) + fn31(OSLO), [PARIS, OSLO]),
        ("no closing tag", fn31(PARIS).removesuffix("</function>"), [PARIS]),
    ],
    "functionary3.2": [  # the prompt ends with '>>>': the answer starts with its recipient
        ("clean", 'get_weather\n{"city": "Paris"}', [PARIS]),
        ("text first", 'all\nLet me check.>>>get_weather\n{"city": "Paris"}', [PARIS]),
        ("two calls", 'get_weather\n{"city": "Paris"}>>>get_weather\n{"city": "Oslo"}', [PARIS, OSLO]),
        ("cut short in the second call", 'get_weather\n{"city": "Paris"}>>>get_wea', [PARIS]),
    ],
    "gpt-oss": [
        ("clean", ANALYSIS + harmony(PARIS), [PARIS]),
        ("no analysis", harmony(PARIS), [PARIS]),
        ("no <|call|>", ANALYSIS + harmony(PARIS).removesuffix("<|call|>"), [PARIS]),
        (
            "recipient in the role",
            ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}',
            [PARIS],
        ),
        (
            "inside the analysis",
            "<|channel|>analysis<|message|>I could write to=functions.get_weather<|message|>"
            f'{{"city": "Oslo"}} but no.<|end|><|start|>assistant{harmony(PARIS)}',
            [PARIS],
        ),
    ],
    "qwen3-coder": [
        ("clean", qwen_xml(PARIS), [PARIS]),
        ("prose before", f"Let me check.\n{qwen_xml(PARIS)}", [PARIS]),
        ("two calls", f"{qwen_xml(PARIS)}\n{qwen_xml(OSLO)}", [PARIS, OSLO]),
        ("no closing tags", qwen_xml(PARIS).removesuffix("</function>\n</tool_call>"), [PARIS]),
        ("inside the reasoning", f"<think>Or {qwen_xml(OSLO)}?</think>\n\n{qwen_xml(PARIS)}", [PARIS]),
        (
            "no <tool_call> around",
            qwen_xml(PARIS).removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"),
            [PARIS],
        ),
    ],
    "glm": [
        ("clean", glm(PARIS), [PARIS]),
        ("prose before", f"Let me check.\n{glm(PARIS)}", [PARIS]),
        ("two calls", f"{glm(PARIS)}\n{glm(OSLO)}", [PARIS, OSLO]),
        ("no closing tag", glm(PARIS).removesuffix("</tool_call>"), [PARIS]),
        ("inside the reasoning", f"<think>Or {glm(OSLO)}?</think>{glm(PARIS)}", [PARIS]),
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
    assert families == {"hermes", "mistral", "llama3", "json", *NATIVE_FAMILIES}


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
    family = call_syntax(path.read_text()).family
    params = {"get_weather": WEATHER["function"]["parameters"]}
    content, calls = tc.parse_tool_calls(text, NAMES, family, params)
    assert [json.loads(c["function"]["arguments"]) for c in calls] == args
    assert "get_weather" not in content.rpartition("</think>")[2].rpartition("<|end|>")[2]
    filt = tc.ToolCallFilter(NAMES, family, params)  # streamed in small pieces: the same calls, no call text
    streamed = "".join(filt.feed(text[i : i + 3]) for i in range(0, len(text), 3))
    tail, again = filt.finish()
    assert [json.loads(c["function"]["arguments"]) for c in again] == args
    assert "get_weather" not in (streamed + tail).rpartition("</think>")[2].rpartition("<|end|>")[2]


#: family -> what an earlier call to get_weather(city=Paris) looks like in the rendered prompt
RENDERED = {
    "deepseek": '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}',
    "kimi": '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}',
    "granite": "get_weather",
    "functionary3.1": '<function=get_weather>{"city": "Paris"}</function>',
    "functionary3.2": '>>>get_weather\n{"city": "Paris"}',
    "gpt-oss": 'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
    "qwen3-coder": "<function=get_weather>\n<parameter=city>\nParis\n</parameter>",
    "glm": "<tool_call>get_weather",
}
NATIVE = [p for p in TEMPLATES if call_syntax(p.read_text()).family in NATIVE_FAMILIES]


@pytest.mark.parametrize("path", NATIVE, ids=lambda p: p.stem)
def test_an_earlier_native_call_renders_back_in_the_templates_own_syntax(path):
    template = path.read_text()
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    req = ChatRequest(
        messages=(
            Message("user", "Weather in Paris?"),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", "sunny", tool_call_id="call_1", name="get_weather"),
        ),
        tools=(WEATHER,),
        tool_choice="auto",
    )
    messages, variables = tc.prompt_messages(req, template)
    if "tool_response_queue.ids.append" in template:  # Kimi K2's newer templates mutate a list: the sandbox refuses
        pytest.skip(f"{path.stem} appends to a list, which the template sandbox refuses (as Hugging Face's does)")
    text = render_chat(template, messages, variables=variables)
    assert RENDERED[call_syntax(template).family] in text
    assert "sunny" in text


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
    clean = clean.removesuffix("<|call|>")  # gpt-oss: the end-of-generation token, not text
    assert accepts(gbnf, clean.replace("\n</tool_call>", "</tool_call>"))


@pytest.mark.parametrize("path", NATIVE, ids=lambda p: p.stem)
def test_a_runtimes_stream_with_the_template_ends_in_the_familys_calls(path):
    """What llama.cpp's and MLX's sessions do: the chunk stream is read with the template's own syntax."""
    from localrun.types import Chunk

    template = path.read_text()
    text = RECORDED[call_syntax(template).family][2][1]  # two calls (or prose then one)
    pieces = [Chunk(text=text[i : i + 5]) for i in range(0, len(text), 5)] + [Chunk(finish_reason="stop")]
    req = ChatRequest(messages=(Message("user", "x"),), tools=(WEATHER,), tool_choice="auto")
    out = list(tc.with_tool_calls(iter(pieces), req, template))
    assert out[-1].finish_reason == "tool_calls"
    assert [json.loads(c["function"]["arguments"]) for c in out[-1].tool_calls] == RECORDED[
        call_syntax(template).family
    ][2][2]
    assert "get_weather" not in "".join(c.text for c in out)
