"""OpenAI's legacy function calling (``functions``, ``function_call``, ``role: "function"``)
on /v1/chat/completions: translated to tools for a runtime that declares them, answered in
the legacy shape (``message.function_call``, ``finish_reason: "function_call"``), refused
with a 400 naming the field and runtime where the runtime has no tools.

Most tests drive the fake runtime through the official ``openai`` client against a real
server process; the fake calls a function when the user says "call NAME" or the choice
forces one. One test runs a forced call on llama.cpp with the tiny random GGUF.
"""

from __future__ import annotations

import json
import logging
import types

import httpx
import openai
import pytest

from tests.conftest import needs_llama
from tests.support.clients import ask, validate

WEATHER = {
    "name": "get_weather",
    "description": "Current weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 2}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"],
    },
}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}

# A template that takes tools (so history turns keep their tool fields) and, when the last
# message says SHOW, stops with what it was given: the runtime's own view of the request.
PROBE = (
    "{% if messages[-1].content == 'SHOW' %}{{ raise_exception({'messages': messages, 'tools': tools} | tojson) }}{% "
    "endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def post(server, **body):
    body = {"model": "tiny", "max_tokens": 64, **body}
    body.setdefault("messages", [{"role": "user", "content": "x"}])
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)


def streamed_call(chunks) -> tuple[dict, str, str | None]:
    """A streamed answer's function call reassembled as old clients do ({name, arguments}), its content and finish."""
    call = {"name": "", "arguments": ""}
    content, finish = "", None
    for c in chunks:
        if not c.choices:
            continue
        delta = c.choices[0].delta
        assert not delta.tool_calls, delta
        if delta.function_call:
            call["name"] += delta.function_call.name or ""
            call["arguments"] += delta.function_call.arguments or ""
        content += delta.content or ""
        finish = c.choices[0].finish_reason or finish
    return call, content, finish


def test_functions_answer_with_a_function_call_not_tool_calls(oai, server):
    r = ask(oai, "please call get_weather for Paris", functions=[WEATHER, TIME])
    choice = r.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.tool_calls is None and choice.message.content is None
    call = choice.message.function_call
    assert call.name == "get_weather" and isinstance(call.arguments, str)
    validate(json.loads(call.arguments), WEATHER["parameters"])

    raw = post(server, messages=[{"role": "user", "content": "call get_time"}], functions=[WEATHER, TIME])
    assert raw.status_code == 200, raw.text
    message = raw.json()["choices"][0]["message"]
    assert "tool_calls" not in message and message["function_call"] == {"name": "get_time", "arguments": "{}"}
    assert raw.json()["choices"][0]["finish_reason"] == "function_call"

    plain = ask(oai, "no function needed", functions=[WEATHER], max_tokens=6)
    assert plain.choices[0].message.function_call is None and plain.choices[0].message.tool_calls is None
    assert plain.choices[0].message.content.startswith("You said: no function needed.")
    assert plain.choices[0].finish_reason == "length"
    # the same request with tools keeps the tools shape: the legacy one is only for 'functions'
    modern = ask(oai, "call get_weather", tools=[{"type": "function", "function": WEATHER}])
    assert modern.choices[0].finish_reason == "tool_calls" and modern.choices[0].message.function_call is None
    assert modern.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_function_call_choices_force_allow_or_forbid(oai):
    forced = ask(oai, "hello", functions=[WEATHER, TIME], function_call={"name": "get_time"})
    assert forced.choices[0].finish_reason == "function_call"
    assert (
        forced.choices[0].message.function_call.name == "get_time"
        and json.loads(forced.choices[0].message.function_call.arguments) == {}
    )
    forced_weather = ask(oai, "call get_time", functions=[WEATHER, TIME], function_call={"name": "get_weather"})
    assert (
        forced_weather.choices[0].message.function_call.name == "get_weather"
    )  # the choice wins over what the user said
    auto = ask(oai, "call get_time", functions=[WEATHER, TIME], function_call="auto")
    assert auto.choices[0].message.function_call.name == "get_time"
    none = ask(oai, "call get_weather", functions=[WEATHER], function_call="none", max_tokens=6)
    assert none.choices[0].message.function_call is None and none.choices[0].finish_reason == "length"
    assert none.choices[0].message.content.startswith("You said: call get_weather.")


def test_streamed_deltas_reassemble_to_the_same_call(oai):
    whole = ask(oai, "call get_weather", functions=[WEATHER, TIME]).choices[0].message.function_call
    call, content, finish = streamed_call(ask(oai, "call get_weather", functions=[WEATHER, TIME], stream=True))
    assert call == {"name": whole.name, "arguments": whole.arguments} and call["name"] == "get_weather"
    assert content == "" and finish == "function_call"
    forced, _, finish = streamed_call(
        ask(
            oai,
            "hi",
            functions=[WEATHER, TIME],
            function_call={"name": "get_time"},
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert forced == {"name": "get_time", "arguments": "{}"} and finish == "function_call"
    call, content, finish = streamed_call(ask(oai, "hello", functions=[WEATHER], stream=True, max_tokens=4))
    assert call == {"name": "", "arguments": ""} and content.startswith("You said: hello") and finish == "length"


def test_history_with_a_function_call_and_its_result_reaches_the_runtime_as_a_tool_turn(serve, tmp_path):
    from tests.factories import write_tiny_llama_gguf

    server = serve(
        write_tiny_llama_gguf(tmp_path / "probe.gguf", chat_template=PROBE), "tiny", fake_capabilities=["tools"]
    )
    args = '{"city": "Paris", "unit": "C"}'
    legacy = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": args}},
        {"role": "function", "name": "get_weather", "content": "sunny, 21 C"},
        {
            "role": "assistant",
            "content": "Checking the time too.",
            "function_call": {"name": "get_time", "arguments": "{}"},
        },
        {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": args}},
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        },
        {"role": "function", "name": "get_weather", "content": "still sunny"},
        {"role": "function", "name": "get_weather", "content": "dry"},
        {"role": "function", "name": "get_time", "content": "noon"},
        {"role": "function", "name": "get_time", "content": "a result nothing asked for"},
    ]

    def seen(messages, **fields) -> dict:
        r = post(server, messages=[*messages, {"role": "user", "content": "SHOW"}], **fields)
        assert r.status_code == 422, r.text
        return json.JSONDecoder().raw_decode(r.json()["error"]["message"].split(": ", 1)[1])[0]

    got = seen(legacy, functions=[WEATHER, TIME])
    msgs = got["messages"]
    assert [m["role"] for m in msgs] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "assistant",
        "assistant",
        "tool",
        "tool",
        "tool",
        "tool",
        "user",
    ]
    assert [c["id"] for c in msgs[1]["tool_calls"]] == ["call_1"] and msgs[1]["tool_calls"][0]["function"][
        "name"
    ] == "get_weather"
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "unit": "C"}
    assert msgs[3]["content"] == "Checking the time too." and msgs[3]["tool_calls"][0]["id"] == "call_3"
    # each result answers the most recent unanswered call of its name; an extra one answers none
    assert [(m["name"], m.get("tool_call_id"), m["content"]) for m in msgs if m["role"] == "tool"] == [
        ("get_weather", "call_1", "sunny, 21 C"),
        ("get_weather", "call_5", "still sunny"),
        ("get_weather", "call_4", "dry"),
        ("get_time", "call_3", "noon"),
        ("get_time", None, "a result nothing asked for"),
    ]
    assert [t["function"]["name"] for t in got["tools"]] == ["get_weather", "get_time"]

    # exactly what the same conversation in today's shape gives the runtime
    def modern_turn(i, m):
        if m.get("function_call"):
            return {
                "role": "assistant",
                "content": m["content"],
                "tool_calls": [{"id": f"call_{i}", "type": "function", "function": m["function_call"]}],
            }
        if m["role"] == "function":
            answered = {2: "call_1", 6: "call_5", 7: "call_4", 8: "call_3"}.get(i)
            return {
                "role": "tool",
                "name": m["name"],
                "content": m["content"],
                **({"tool_call_id": answered} if answered else {}),
            }
        return m

    modern = seen(
        [modern_turn(i, m) for i, m in enumerate(legacy)],
        tools=[{"type": "function", "function": f} for f in (WEATHER, TIME)],
    )
    assert modern == got

    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        r = client.chat.completions.create(
            model="tiny",
            messages=[*legacy[:3], {"role": "user", "content": "thanks"}],
            functions=[WEATHER],
            max_tokens=4,
        )
        assert (
            r.choices[0].message.content.startswith("You said: thanks.") and r.choices[0].message.function_call is None
        )
        again = client.chat.completions.create(
            model="tiny", messages=legacy[:3], max_tokens=8
        )  # a history alone, no functions
        assert again.choices[0].message.content.startswith("You said: weather in Paris?")


def test_malformed_or_mixed_legacy_requests_are_400_before_anything_runs(server):
    history_call = {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}}
    cases = [
        ({"functions": [WEATHER], "tools": [{"type": "function", "function": TIME}]}, ("functions", "tools")),
        ({"functions": [WEATHER], "tool_choice": "auto"}, ("functions", "tool_choice")),
        ({"function_call": "auto", "tools": [{"type": "function", "function": TIME}]}, ("function_call", "tools")),
        ({"functions": [WEATHER], "function_call": {"name": "get_time"}}, ("function_call", "get_time")),
        ({"function_call": {"name": "get_time"}}, ("function_call",)),
        ({"functions": [WEATHER], "function_call": "required"}, ("function_call",)),
        ({"functions": [{**TIME, "bogus": 1}]}, ("unknown field", "bogus")),
        ({"functions": [{"name": "bad name!"}]}, ("functions",)),
        ({"functions": [{"description": "no name"}]}, ("functions", "name")),
        ({"functions": [{"name": f"f{i}"} for i in range(129)]}, ("functions",)),
        ({"functions": {"name": "f"}}, ("functions",)),
        ({"function_call": {"name": "get_time", "arguments": "{}"}}, ("function_call",)),
        ({"messages": [{"role": "function", "content": "r"}], "functions": [WEATHER]}, ("messages[0]", "name")),
        (
            {"messages": [{"role": "user", "content": "x", "function_call": {"name": "f", "arguments": "{}"}}]},
            ("messages[0]", "function_call"),
        ),
        (
            {
                "messages": [
                    {
                        **history_call,
                        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                    }
                ]
            },
            ("messages[0]", "tool_calls", "function_call"),
        ),
        ({"messages": [{**history_call, "function_call": {"name": "f"}}]}, ("messages.0.function_call.arguments",)),
        (
            {"messages": [{**history_call, "function_call": {"name": "f", "arguments": "{}", "x": 1}}]},
            ("unknown field",),
        ),
    ]
    for body, words in cases:
        r = post(server, **body)
        assert r.status_code == 400, (body, r.status_code, r.text)
        message = r.json()["error"]["message"]
        assert all(w in message for w in words), (body, message)
    # the functions+tools refusal names both fields
    both = post(server, functions=[WEATHER], tools=[{"type": "function", "function": TIME}]).json()["error"]
    assert both["param"] == "functions" and "'tools'" in both["message"]


def test_a_runtime_without_tools_refuses_legacy_functions_naming_the_field(serve, tiny_gguf):
    server = serve(tiny_gguf, "tiny", fake_capabilities=["logprobs"])
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        for kwargs, field in (
            ({"functions": [WEATHER]}, "functions"),
            ({"functions": [WEATHER], "function_call": {"name": "get_weather"}}, "functions"),
            ({"functions": [WEATHER], "function_call": "none"}, "functions"),
        ):
            with pytest.raises(openai.BadRequestError) as info:
                ask(client, "call get_weather", **kwargs)
            assert (
                field in info.value.message
                and "fake runtime" in info.value.message
                and info.value.body["param"] == field
            )
        history = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}},
            {"role": "function", "name": "get_weather", "content": "r"},
        ]
        with pytest.raises(openai.BadRequestError, match=r"messages\[1\].*fake runtime"):
            client.chat.completions.create(model="tiny", messages=history)
        with pytest.raises(openai.BadRequestError, match=r"messages\[0\].*fake runtime"):
            client.chat.completions.create(model="tiny", messages=[{"role": "function", "name": "f", "content": "r"}])
        # "auto" / "none" with no functions asks nothing of the runtime, as tool_choice "auto" does
        assert ask(client, "hi", function_call="auto", max_tokens=3).choices[0].message.content.startswith("You said")


def test_several_calls_answer_the_first_and_log_the_rest_as_dropped(caplog):
    """The legacy shape carries one call; a model that made more has the rest dropped, said at info."""
    from localrun.server.openai import events as openai_api

    calls = tuple(
        {"id": f"call_{n}", "type": "function", "function": {"name": n, "arguments": f'{{"n": "{n}"}}'}}
        for n in ("get_weather", "get_time", "add")
    )
    gen = types.SimpleNamespace(tool_calls=calls, record=types.SimpleNamespace(name="tiny"), finish_reason="tool_calls")
    with caplog.at_level(logging.INFO, logger=openai_api.log.name):
        assert openai_api.function_call(gen) == {"name": "get_weather", "arguments": '{"n": "get_weather"}'}
    (record,) = [r for r in caplog.records if r.name == openai_api.log.name]
    assert record.levelno == logging.INFO and "dropped" in record.getMessage()
    assert "get_time" in record.getMessage() and "add" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=openai_api.log.name):
        assert (
            openai_api.function_call(types.SimpleNamespace(**{**vars(gen), "tool_calls": calls[:1]}))["name"]
            == "get_weather"
        )
    assert not caplog.records
    assert openai_api.finish_of(gen, True) == "function_call" and openai_api.finish_of(gen, False) == "tool_calls"


# --- llama.cpp: a forced function_call is a valid call by grammar -------------------------------------

CITY = {
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}
CLOCK = {
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]},
}


@pytest.fixture(scope="module")
def tiny_long(tmp_path_factory):
    """The tiny random llama with room for the fallback functions block (see test_llama_server.py)."""
    from tests.factories import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny-long") / "tiny-long.gguf", n_ctx_train=4096)


@needs_llama
@pytest.mark.llama
def test_llama_forced_function_call_is_valid_by_grammar(serve, tiny_long):
    server = serve(tiny_long, "tiny", runtime="", plan={"n_threads": 1})
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=180) as client:
        r = ask(
            client,
            "What is the weather in Paris for 3 days?",
            functions=[CITY, CLOCK],
            function_call={"name": "get_weather"},
            max_tokens=120,
            temperature=0,
        )
        choice = r.choices[0]
        assert (
            choice.finish_reason == "function_call" and not choice.message.content and choice.message.tool_calls is None
        )
        assert choice.message.function_call.name == "get_weather"
        validate(json.loads(choice.message.function_call.arguments), CITY["parameters"])
        call, content, finish = streamed_call(
            ask(
                client,
                "What time is it?",
                functions=[CITY, CLOCK],
                function_call={"name": "get_time"},
                max_tokens=120,
                temperature=0,
                stream=True,
            )
        )
        assert call["name"] == "get_time" and not content and finish == "function_call"
        validate(json.loads(call["arguments"]), CLOCK["parameters"])
        with pytest.raises(openai.BadRequestError, match="llama.cpp"):  # it was llama.cpp that answered
            client.embeddings.create(model="tiny", input="x")
