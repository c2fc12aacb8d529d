"""localrun.chat.tools: tool definitions into the prompt, calls out of the answer, forced calls."""

from __future__ import annotations

import json

import pytest

from localrun.chat import tools as tc
from localrun.chat.template import render_chat
from localrun.errors import UnsupportedFeature
from localrun.types import ChatRequest, Chunk, Message, Usage

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ADD = {
    "type": "function",
    "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}},
}
NAMES = ("get_weather", "add")

# A Qwen-like template that takes tools itself and writes calls as <tool_call> blocks.
NATIVE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson "
    "}}</tool_call>{% endfor %}"
    "{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PLAIN = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}<assistant>"
HISTORY = (
    Message("user", "weather in Paris?"),
    Message(
        "assistant",
        "",
        tool_calls=(
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        ),
    ),
    Message("tool", "sunny, 21 C", tool_call_id="call_1", name="get_weather"),
    Message("tool", "humidity 40%", tool_call_id="call_1", name="get_weather"),
)


def render(req: ChatRequest, template: str) -> str:
    messages, variables = tc.prompt_messages(req, template)
    return render_chat(template, messages, variables=variables)


def test_template_use_of_tools_is_parsed_not_guessed():
    assert tc.template_uses_tools(NATIVE)
    assert not tc.template_uses_tools(PLAIN)
    assert not tc.template_uses_tools("{# tools are not supported #}{{ messages }}")
    assert not tc.template_uses_tools(None)
    assert tc.tool_style(NATIVE) is tc.HERMES and tc.tool_style(PLAIN) is tc.HERMES
    assert tc.tool_style("{{ tools }}[TOOL_CALLS]") is tc.MISTRAL
    assert tc.tool_style("{{ tools }}<|python_tag|>") is tc.LLAMA3
    assert tc.tool_style("{{ tools }}") is tc.BARE_JSON


def test_native_template_gets_tools_and_history_with_argument_objects():
    text = render(ChatRequest(messages=HISTORY, tools=(WEATHER,), tool_choice="auto"), NATIVE)
    assert '"name": "get_weather"' in text and "Tools:" in text
    assert '<tool_call>get_weather {"city": "Paris"}</tool_call>' in text  # arguments passed as an object
    assert "[call_1]" in text and "<|im_start|>tool\nsunny, 21 C" in text


def test_tool_choice_none_keeps_tools_out_of_the_prompt():
    text = render(ChatRequest(messages=HISTORY[:1], tools=(WEATHER,), tool_choice="none"), NATIVE)
    assert "Tools:" not in text and "get_weather" not in text
    plain = render(ChatRequest(messages=HISTORY[:1], tools=(WEATHER,), tool_choice="none"), PLAIN)
    assert "get_weather" not in plain


def test_fallback_system_block_and_history_for_templates_without_tools():
    text = render(ChatRequest(messages=(Message("system", "Be brief."), *HISTORY), tools=(WEATHER, ADD)), PLAIN)
    assert text.startswith("<system>Be brief.\n\nYou can call these functions")
    assert '"name": "add"' in text and "<tool_call>" in text
    assert (
        '<assistant><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call></assistant>' in text
    )
    # both results, one user turn, so user/assistant still alternate
    assert text.count("<tool_response name=") == 2 and text.count("<user>") == 2
    assert '<tool_response name="get_weather">\nsunny, 21 C\n</tool_response>' in text


def test_a_request_without_tools_renders_as_before():
    req = ChatRequest(messages=(Message("user", "hi"),))
    assert render(req, PLAIN) == render_chat(PLAIN, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (
            'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "Let me look.",
            [("get_weather", {"city": "Paris"})],
        ),
        (
            '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n<tool_call>{"name": "add", "arguments": '
            '{"a": 2}}</tool_call>',
            "",
            [("add", {"a": 1}), ("add", {"a": 2})],
        ),
        (
            '<tool_call>{"name": "add", "arguments": {"a": 1}}',
            "",
            [("add", {"a": 1})],
        ),  # stopped before the closing tag
        ('<tool_call>\n<function=add>{"a": 3}</function>\n</tool_call>', "", [("add", {"a": 3})]),
        ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}, "id": "abc123def"}]', "", [("add", {"a": 1})]),
        (
            '[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]get_weather[CALL_ID]x1[ARGS]{"city": "Oslo"}',
            "",
            [("add", {"a": 1}), ("get_weather", {"city": "Oslo"})],
        ),
        ('<|python_tag|>{"name": "add", "parameters": {"a": 5}}', "", [("add", {"a": 5})]),
        ('{"type": "function", "name": "add", "parameters": {"a": 5}}', "", [("add", {"a": 5})]),
        (
            '{"name": "add", "parameters": {"a": 1}}; {"name": "add", "parameters": {"a": 2}}',
            "",
            [("add", {"a": 1}), ("add", {"a": 2})],
        ),
        ('[add(a=1), get_weather(city="Rome")]', "", [("add", {"a": 1}), ("get_weather", {"city": "Rome"})]),
        ('<function=get_weather>{"city": "Lima"}</function>', "", [("get_weather", {"city": "Lima"})]),
        ('```json\n{"name": "add", "arguments": {"a": 7}}\n```', "", [("add", {"a": 7})]),
        ('{"name": "add", "arguments": "{\\"a\\": 8}"}', "", [("add", {"a": 8})]),  # arguments already a string
    ],
)
def test_call_formats_are_recognised(text, content, calls):
    left, found = tc.parse_tool_calls(text, NAMES)
    assert left == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in found] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in found)
    assert len({c["id"] for c in found}) == len(found)


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "delete_everything", "arguments": {}}',  # not one of the request's tools
        '{"answer": 42}',  # JSON, but not a call
        "<tool_call>{not json}</tool_call>",
        "[TOOL_CALLS] nonsense",
        "[print(1), os.system('x')]",
        '[add(a=__import__("os"))]',  # only literals are evaluated
        "plain words",
    ],
)
def test_what_is_not_a_call_stays_content(text):
    assert tc.parse_tool_calls(text, NAMES) == (text, [])


def test_filter_streams_content_and_holds_back_calls():
    f = tc.ToolCallFilter(NAMES)
    pieces = ["Checking", " now <to", "ol_call>", '{"name": "add", ', '"arguments": {"a": 1}}', "</tool_call>"]
    out = [f.feed(p) for p in pieces]
    assert out == ["Checking", " now ", "", "", "", ""]
    rest, calls = f.finish()
    assert rest == "" and calls[0]["function"]["name"] == "add"


def test_filter_releases_a_false_alarm():
    f = tc.ToolCallFilter(NAMES)
    assert f.feed("a <") == "a "  # could be a marker: held
    assert f.feed("b> and <tool") == "<b> and "
    assert f.feed("box") == "<toolbox"
    assert f.finish() == ("", [])


def test_filter_holds_a_leading_json_answer_and_gives_it_back_when_not_a_call():
    f = tc.ToolCallFilter(NAMES)
    assert f.feed("  ") == "" and f.feed('{"answer"') == "" and f.feed(": 1}") == ""
    assert f.finish() == ('  {"answer": 1}', [])


def _chunks(*texts, reason="stop"):
    *body, last = texts
    yield from (Chunk(text=t, logprobs=({"token": t, "logprob": -0.5, "bytes": [], "top_logprobs": []},)) for t in body)
    yield Chunk(text=last, finish_reason=reason, usage=Usage(1, len(texts)))


def test_stream_wrapper_puts_calls_on_the_last_chunk_and_keeps_every_logprob():
    req = ChatRequest(messages=(Message("user", "x"),), tools=(ADD,))
    out = list(
        tc.with_tool_calls(
            _chunks("Sure.", " <tool_call>", '{"name": "add", "arguments": {}}', "</tool_call>", ""), req
        )
    )
    assert "".join(c.text for c in out) == "Sure. "
    assert out[-1].finish_reason == "tool_calls" and out[-1].tool_calls[0]["function"]["name"] == "add"
    assert [lp["token"] for c in out for lp in c.logprobs] == [
        "Sure.",
        " <tool_call>",
        '{"name": "add", "arguments": {}}',
        "</tool_call>",
    ]
    plain = list(tc.with_tool_calls(_chunks("no", " call", ""), req))
    assert (
        "".join(c.text for c in plain) == "no call" and plain[-1].finish_reason == "stop" and not plain[-1].tool_calls
    )


def test_forced_call_schema_and_wrapping():
    req = ChatRequest(messages=(), tools=(WEATHER, ADD), tool_choice="required")
    forced = tc.forced_call(req, tc.HERMES)
    assert forced.prefix == "<tool_call>\n" and forced.suffix == "\n</tool_call>"
    assert [o["properties"]["name"]["const"] for o in forced.schema["anyOf"]] == ["get_weather", "add"]
    named = tc.forced_call(
        ChatRequest(messages=(), tools=(WEATHER, ADD), tool_choice={"type": "function", "function": {"name": "add"}}),
        tc.LLAMA3,
    )
    assert named.schema["properties"]["name"] == {"const": "add"} and "parameters" in named.schema["required"]
    mistral = tc.forced_call(req, tc.MISTRAL)
    assert (mistral.prefix, mistral.suffix) == ("[TOOL_CALLS][", "]")
    assert tc.forced_call(ChatRequest(messages=(), tools=(ADD,), tool_choice="auto"), tc.HERMES) is None
    with pytest.raises(UnsupportedFeature, match="nope"):
        tc.forced_call(
            ChatRequest(messages=(), tools=(ADD,), tool_choice={"type": "function", "function": {"name": "nope"}}),
            tc.HERMES,
        )


def test_closing_the_wrapper_closes_the_runtime_stream_at_once():
    closed = []

    def runtime():
        try:
            yield Chunk(text="a")
            yield Chunk(text="b")
            yield Chunk(text="", finish_reason="stop")
        finally:
            closed.append(True)

    req = ChatRequest(messages=(Message("user", "x"),), tools=(ADD,))
    inner = runtime()  # a reference elsewhere (the worker's frame) must not delay it
    stream = tc.with_tool_calls(inner, req)
    assert next(stream).text == "a"
    stream.close()
    assert closed == [True]
