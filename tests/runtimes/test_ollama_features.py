"""Tools, structured outputs and log-probabilities on the Ollama runtime, against the fake
Ollama server: first the fake itself with the official ``ollama`` client (so it answers as
Ollama does), then the runtime's session, then localrun's server with the official
``openai`` and ``ollama`` clients — in-process (uvicorn on a thread) and as a real
``localrun serve`` process.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import openai
import pytest

from localrun.chat.tool_calls import openai_calls
from localrun.errors import UnsupportedFeature
from localrun.runtimes.ollama import OllamaRuntime
from localrun.runtimes.ollama_wire import ollama_messages, parse_version, session_capabilities
from localrun.types import (
    Cancel,
    ChatRequest,
    Chunk,
    CompletionRequest,
    Format,
    Message,
    ModelRecord,
    Plan,
    Sampling,
    fold,
)
from tests.runtimes.fake_ollama import FakeModel, FakeOllama
from tests.support.servers import free_port

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 2}, "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
USER = (Message("user", "please call get_weather for Paris"),)


@pytest.fixture
def fake():
    models = [
        FakeModel("llama3.2:latest", capabilities=("completion", "tools")),
        FakeModel("plain:latest"),
        FakeModel("tiny:latest", capabilities=("completion", "tools")),
        FakeModel("nomic-embed-text:latest", capabilities=("embedding",)),
    ]
    with FakeOllama(models) as server:
        yield server
    assert server.state.errors == [], "the fake Ollama server failed while handling a request"


def _session(fake, name: str = "llama3.2"):
    record = ModelRecord(name=name, format=Format.GGUF, path="")
    return OllamaRuntime(host=fake.url).load(record, Plan(runtime="ollama", n_ctx=1024))


def _bodies(fake, path: str) -> list[dict]:
    return [body for p, body in fake.state.requests if p == path]


def _last_chunk(chunks: list[Chunk]) -> Chunk:
    assert chunks and chunks[-1].finish_reason is not None
    return chunks[-1]


# --- the fake, with the official client ----------------------------------------------------


def test_fake_answers_tools_format_and_logprobs_as_ollama_does(fake):
    client = ollama.Client(host=fake.url)
    user = [{"role": "user", "content": "call get_weather"}]
    r = client.chat(model="llama3.2", messages=user, tools=[WEATHER])
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict) and r.done_reason == "stop"
    sent = _bodies(fake, "/api/chat")[-1]["tools"][0]["function"]["parameters"]  # the client drops minLength
    jsonschema.validate(dict(call.function.arguments), sent)
    streamed = list(client.chat(model="llama3.2", messages=user, tools=[WEATHER], stream=True))
    assert [c.function.name for p in streamed for c in p.message.tool_calls or ()] == ["get_weather"]
    history = [
        *user,
        r.message.model_dump(exclude_none=True),
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    after = client.chat(model="llama3.2", messages=history, tools=[WEATHER], options={"num_predict": 3})
    assert not after.message.tool_calls and len(after.message.content.split()) == 3
    with pytest.raises(ollama.ResponseError, match="does not support tools") as info:
        client.chat(model="plain", messages=user, tools=[WEATHER])
    assert info.value.status_code == 400

    schema = client.chat(model="llama3.2", messages=user, format=PERSON)
    jsonschema.validate(json.loads(schema.message.content), PERSON)
    assert isinstance(json.loads(client.generate(model="llama3.2", prompt="x", format="json").response), dict)
    bad = httpx.post(f"{fake.url}/api/generate", json={"model": "llama3.2", "prompt": "x", "format": "xml"})
    assert bad.status_code == 400 and "invalid format" in bad.json()["error"]  # the client itself refuses "xml"

    lp = client.chat(model="llama3.2", messages=user, logprobs=True, top_logprobs=2, options={"num_predict": 4})
    assert len(lp.logprobs) == 4 and "".join(e.token for e in lp.logprobs) == lp.message.content
    assert all(
        e.logprob < 0 and [a.token for a in e.top_logprobs][0] == e.token and len(e.top_logprobs) == 2
        for e in lp.logprobs
    )
    gen = list(client.generate(model="llama3.2", prompt="x", logprobs=True, stream=True, options={"num_predict": 3}))
    assert [len(p.logprobs or ()) for p in gen] == [1, 1, 1, 0] and gen[0].logprobs[0].top_logprobs is None


def test_fake_plays_older_ollama_versions(fake):
    client = ollama.Client(host=fake.url)
    fake.state.version = "0.12.3"
    assert httpx.get(f"{fake.url}/api/version").json() == {"version": "0.12.3"}
    answer = client.chat(
        model="llama3.2", messages=[{"role": "user", "content": "hi"}], logprobs=True, options={"num_predict": 3}
    )
    assert answer.message.content and not answer.logprobs  # ignored, as Ollama did before 0.12.11
    fake.state.version = "0.4.7"
    with pytest.raises(ollama.ResponseError, match="cannot unmarshal object"):
        client.chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}], format=PERSON)
    assert client.chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}], format="json").message.content


def test_fake_refuses_string_arguments_in_history_as_ollamas_go_types_do(fake):
    history = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]
    r = httpx.post(f"{fake.url}/api/chat", json={"model": "llama3.2", "messages": history, "stream": False})
    assert r.status_code == 400 and "cannot unmarshal string" in r.json()["error"]


# --- capabilities --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "caps,version,expected",
    [
        (("completion", "tools"), "0.13.0", {"tools", "json_schema", "logprobs"}),
        (("completion",), "0.12.11", {"json_schema", "logprobs"}),
        (("completion", "tools"), "0.12.10", {"tools", "json_schema"}),
        (("completion", "tools"), "0.4.7", {"tools"}),
        (None, "0.5.4", {"embeddings", "json_schema"}),  # no capabilities list: tools unknown, so not declared
        (("embedding",), "0.13.0", {"embeddings"}),
        (("completion", "tools"), "0.0.0", {"tools", "json_schema", "logprobs"}),  # a source build
    ],
)
def test_capabilities_follow_the_models_list_and_the_servers_version(fake, caps, version, expected):
    fake.state.models["m:latest"] = FakeModel("m:latest", capabilities=caps)
    fake.state.version = version
    session = _session(fake, "m")
    try:
        assert session.capabilities == frozenset(expected)
    finally:
        session.close()
    assert session_capabilities(caps, parse_version(version)) == frozenset(expected)


def test_a_server_that_hides_its_version_is_taken_as_current(fake):
    fake.state.version = None
    assert httpx.get(f"{fake.url}/api/version").status_code == 404
    session = _session(fake)
    assert {"tools", "json_schema", "logprobs"} <= session.capabilities
    entries = [
        e
        for c in session.chat(ChatRequest(messages=USER, sampling=Sampling(logprobs=0, max_tokens=2)), Cancel())
        for e in c.logprobs
    ]
    assert len(entries) == 2
    session.close()


def test_version_parsing():
    assert parse_version("0.12.11") == (0, 12, 11) and parse_version("v0.5.0-rc3") == (0, 5, 0)
    assert parse_version("0.6") == (0, 6, 0) and parse_version("0.0.0") is None and parse_version("dev") is None
    assert parse_version("0.12.11") > parse_version("0.12.3")


# --- tools through the session --------------------------------------------------------------


@pytest.mark.parametrize("ollama_ids", [True, False])
def test_tool_call_round_trip(fake, ollama_ids):
    fake.state.tool_call_ids = ollama_ids
    session = _session(fake)
    chunks = list(session.chat(ChatRequest(messages=USER, tools=(WEATHER, TIME)), Cancel()))
    last = _last_chunk(chunks)
    assert last.finish_reason == "tool_calls" and "".join(c.text for c in chunks) == ""
    (call,) = last.tool_calls
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert call["id"].startswith("call_") and len(call["id"]) > len("call_") + 7
    assert isinstance(call["function"]["arguments"], str)
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
    sent = _bodies(fake, "/api/chat")[-1]
    assert sent["tools"] == [WEATHER, TIME] and "tool_choice" not in sent

    follow = ChatRequest(
        messages=(
            *USER,
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", "sunny, 21 C", tool_call_id=call["id"]),
        ),
        tools=(WEATHER,),
        sampling=Sampling(max_tokens=4),
    )
    text, finish, _ = fold(session.chat(follow, Cancel()))
    assert finish == "length" and len(text.split()) == 4
    assistant, tool = _bodies(fake, "/api/chat")[-1]["messages"][1:]
    assert assistant["role"] == "assistant" and assistant["content"] == ""
    assert [c["function"] for c in assistant["tool_calls"]] == [
        {"name": "get_weather", "arguments": json.loads(call["function"]["arguments"])}
    ]
    assert tool["role"] == "tool" and tool["content"] == "sunny, 21 C" and tool["tool_name"] == "get_weather"
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"] == call["id"]
    session.close()


def test_two_calls_in_separate_chunks_both_reach_the_last_chunk(fake, monkeypatch):
    from tests.runtimes import fake_ollama as module

    def two_calls(self, body, prompt, *, chat, empty):
        self._start_stream()
        for name, args in (("get_weather", {"city": "Oslo", "unit": "C"}), ("get_time", {})):
            self._line(
                {
                    "model": body["model"],
                    "done": False,
                    "message": {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"function": {"name": name, "arguments": args}}],
                    },
                }
            )
        self._line(
            {
                "model": body["model"],
                "done": True,
                "done_reason": "stop",
                "message": {"role": "assistant", "content": ""},
                "prompt_eval_count": 5,
                "eval_count": 9,
            }
        )
        self._end_stream()

    session = _session(fake)
    monkeypatch.setattr(module._Handler, "_run", two_calls)
    last = _last_chunk(list(session.chat(ChatRequest(messages=USER, tools=(WEATHER, TIME)), Cancel())))
    assert last.finish_reason == "tool_calls" and last.usage.completion_tokens == 9
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in last.tool_calls] == [
        ("get_weather", {"city": "Oslo", "unit": "C"}),
        ("get_time", {}),
    ]
    assert len({c["id"] for c in last.tool_calls}) == 2


def test_tool_choice_none_and_auto_are_honoured_and_forcing_is_refused(fake):
    session = _session(fake)
    none = list(session.chat(ChatRequest(messages=USER, tools=(WEATHER,), tool_choice="none"), Cancel()))
    assert "tools" not in _bodies(fake, "/api/chat")[-1] and _last_chunk(none).finish_reason != "tool_calls"
    auto = list(session.chat(ChatRequest(messages=USER, tools=(WEATHER,), tool_choice="auto"), Cancel()))
    assert _bodies(fake, "/api/chat")[-1]["tools"] == [WEATHER] and _last_chunk(auto).finish_reason == "tool_calls"
    sent = len(fake.state.requests)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(UnsupportedFeature, match="cannot force") as info:
            session.chat(ChatRequest(messages=USER, tools=(WEATHER,), tool_choice=choice), Cancel())
        assert info.value.param == "tool_choice" and "auto" in info.value.hint
    with pytest.raises(UnsupportedFeature, match="'nope'") as info:
        session.chat(
            ChatRequest(
                messages=USER, tools=(WEATHER,), tool_choice={"type": "function", "function": {"name": "nope"}}
            ),
            Cancel(),
        )
    assert info.value.param == "tool_choice"
    assert len(fake.state.requests) == sent, "a refused request reached Ollama"


def test_tools_on_a_model_without_them_are_refused_before_anything_is_sent(fake):
    session = _session(fake, "plain")
    assert "tools" not in session.capabilities
    sent = len(fake.state.requests)
    with pytest.raises(UnsupportedFeature) as info:
        session.chat(ChatRequest(messages=USER, tools=(WEATHER,)), Cancel())
    assert info.value.param == "tools"
    history = (
        Message(
            "assistant",
            "",
            tool_calls=({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},),
        ),
        Message("tool", "r", tool_call_id="c1"),
    )
    with pytest.raises(UnsupportedFeature) as info:
        session.chat(ChatRequest(messages=history), Cancel())
    assert info.value.param == "messages[0]"
    assert len(fake.state.requests) == sent


def test_history_arguments_that_are_not_a_json_object_are_refused_naming_the_message(fake):
    session = _session(fake)
    for bad in ("{not json", "[1, 2]"):
        call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": bad}}
        req = ChatRequest(
            messages=(*USER, Message("assistant", "", tool_calls=(call,)), Message("tool", "x", tool_call_id="c1")),
            tools=(WEATHER,),
        )
        with pytest.raises(UnsupportedFeature, match=r"messages\[1\].*get_weather.*not a JSON object") as info:
            session.chat(req, Cancel())
        assert info.value.param == "messages[1]"


def test_messages_in_ollamas_shape():
    calls = (
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}},
    )
    out = ollama_messages(
        (
            Message("user", "u"),
            Message("assistant", "", tool_calls=calls),
            Message("tool", "1", tool_call_id="b"),
            Message("tool", "2", tool_call_id="a"),
            Message("tool", "3", tool_call_id="a", name="named"),
        )
    )
    assert out[0] == {"role": "user", "content": "u"}
    assert out[1]["tool_calls"] == [
        {"id": "a", "function": {"name": "f", "arguments": {"x": 1}}},
        {"id": "b", "function": {"name": "g", "arguments": {}}},
    ]
    assert [m["tool_name"] for m in out[2:]] == ["g", "f", "named"]
    back = openai_calls(
        [
            {"function": {"name": "f", "arguments": {"x": "é"}}},
            {"id": "call_7", "function": {"name": "g", "arguments": {}}},
        ]
    )
    assert back[0]["function"] == {"name": "f", "arguments": '{"x": "é"}'} and back[0]["id"].startswith("call_")
    assert back[1] == {"id": "call_7", "type": "function", "function": {"name": "g", "arguments": "{}"}}


# --- structured outputs and grammars ----------------------------------------------------------


def test_json_schema_sends_the_schema_and_the_answer_validates(fake):
    session = _session(fake)
    text, finish, _ = fold(session.chat(ChatRequest(messages=USER, sampling=Sampling(json_schema=PERSON)), Cancel()))
    jsonschema.validate(json.loads(text), PERSON)
    body = _bodies(fake, "/api/chat")[-1]
    assert body["format"] == PERSON and "format" not in body["options"] and finish == "stop"
    raw, _, _ = fold(session.complete(CompletionRequest("x", Sampling(json_schema=PERSON)), Cancel()))
    jsonschema.validate(json.loads(raw), PERSON)
    assert _bodies(fake, "/api/generate")[-1]["format"] == PERSON


def test_json_object_sends_format_json(fake):
    session = _session(fake)
    text, _, _ = fold(session.chat(ChatRequest(messages=USER, sampling=Sampling(json_schema={})), Cancel()))
    assert _bodies(fake, "/api/chat")[-1]["format"] == "json" and isinstance(json.loads(text), dict)
    fold(session.chat(ChatRequest(messages=USER), Cancel()))
    assert "format" not in _bodies(fake, "/api/chat")[-1]


def test_a_grammar_is_refused(fake):
    session = _session(fake)
    sent = len(fake.state.requests)
    with pytest.raises(UnsupportedFeature, match="GBNF") as info:
        session.chat(ChatRequest(messages=USER, sampling=Sampling(grammar='root ::= "a"')), Cancel())
    assert info.value.param == "grammar"
    with pytest.raises(UnsupportedFeature, match="GBNF"):
        session.complete(CompletionRequest("x", Sampling(grammar='root ::= "a"')), Cancel())
    assert len(fake.state.requests) == sent


# --- log-probabilities -------------------------------------------------------------------------


def test_logprobs_come_through_on_chat_and_completion(fake):
    session = _session(fake)
    chunks = list(session.chat(ChatRequest(messages=USER, sampling=Sampling(logprobs=3, max_tokens=5)), Cancel()))
    entries = [e for c in chunks for e in c.logprobs]
    assert len(entries) == 5 and "".join(e["token"] for e in entries) == "".join(c.text for c in chunks)
    for e in entries:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"} and e["logprob"] < 0
        assert bytes(e["bytes"]).decode() == e["token"] and len(e["top_logprobs"]) == 3
        assert e["top_logprobs"][0]["token"] == e["token"] and set(e["top_logprobs"][0]) == {
            "token",
            "logprob",
            "bytes",
        }
    body = _bodies(fake, "/api/chat")[-1]
    assert body["logprobs"] is True and body["top_logprobs"] == 3 and "logprobs" not in body["options"]

    done = list(session.complete(CompletionRequest("once", Sampling(logprobs=0, max_tokens=3)), Cancel()))
    entries = [e for c in done for e in c.logprobs]
    assert len(entries) == 3 and all(e["top_logprobs"] == [] for e in entries)
    assert _bodies(fake, "/api/generate")[-1]["top_logprobs"] == 0
    plain = list(session.chat(ChatRequest(messages=USER, sampling=Sampling(max_tokens=3)), Cancel()))
    assert not any(c.logprobs for c in plain) and "logprobs" not in _bodies(fake, "/api/chat")[-1]


def test_an_older_ollama_declares_no_logprobs_and_the_session_refuses_them(fake):
    fake.state.version = "0.12.3"
    session = _session(fake)
    assert "logprobs" not in session.capabilities and "json_schema" in session.capabilities
    with pytest.raises(UnsupportedFeature, match=r"0\.12\.11") as info:
        session.chat(ChatRequest(messages=USER, sampling=Sampling(logprobs=0)), Cancel())
    assert info.value.param == "logprobs"
    fake.state.version = "0.4.7"
    old = _session(fake)
    with pytest.raises(UnsupportedFeature, match=r"0\.5\.0") as info:
        old.complete(CompletionRequest("x", Sampling(json_schema={})), Cancel())
    assert info.value.param == "response_format"


def test_an_ollama_that_answers_without_logprobs_is_an_error_not_an_empty_list(fake):
    session = _session(fake)  # loaded as 0.13.0: logprobs declared
    fake.state.version = "0.12.3"  # ...but it now answers as an older Ollama, ignoring them
    with pytest.raises(UnsupportedFeature, match=r"without log-probabilities.*0\.12\.11") as info:
        list(session.chat(ChatRequest(messages=USER, sampling=Sampling(logprobs=1, max_tokens=3)), Cancel()))
    assert info.value.param == "logprobs"


# --- through localrun's server ------------------------------------------------------------------


@pytest.fixture
def live_url(fake, build_stack, live_factory):  # noqa: F811 - the imported fixtures
    def planner(record):
        return Plan(runtime="ollama", n_ctx=1024, options={"ollama_host": fake.url})

    return live_factory(build_stack(planner=planner)).url


@pytest.fixture
def oai(live_url):
    with openai.OpenAI(base_url=f"{live_url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        yield client


def _ask(oai, text: str, **kwargs):
    kwargs.setdefault("max_tokens", 64)
    return oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}], **kwargs)


def test_openai_client_tool_round_trip(oai, fake):
    r = _ask(oai, "please call get_weather for Paris", tools=[WEATHER, TIME])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    history = [
        {"role": "user", "content": "please call get_weather for Paris"},
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    again = oai.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], max_tokens=4)
    assert again.choices[0].finish_reason == "length" and again.choices[0].message.content
    sent = _bodies(fake, "/api/chat")[-1]["messages"]
    assert sent[1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": json.loads(call.function.arguments),
    }
    assert sent[2] == {"role": "tool", "content": "sunny", "tool_name": "get_weather", "tool_call_id": call.id}

    chunks = list(_ask(oai, "call get_time", tools=[WEATHER, TIME], stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [(0, "get_time", {})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_openai_client_forced_tool_choice_is_a_400_naming_tool_choice(oai, fake):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(openai.BadRequestError) as info:
            _ask(oai, "x", tools=[WEATHER], tool_choice=choice)
        assert info.value.body["param"] == "tool_choice" and "cannot force" in info.value.message
    assert _ask(oai, "call get_weather", tools=[WEATHER], tool_choice="none").choices[0].finish_reason != "tool_calls"
    assert "tools" not in _bodies(fake, "/api/chat")[-1]


def test_openai_client_response_formats(oai, fake):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = _ask(oai, "who?", response_format=fmt)
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    assert _bodies(fake, "/api/chat")[-1]["format"] == PERSON
    streamed = "".join(
        c.choices[0].delta.content or "" for c in _ask(oai, "who?", response_format=fmt, stream=True) if c.choices
    )
    assert json.loads(streamed) == json.loads(r.choices[0].message.content)
    obj = _ask(oai, "anything", response_format={"type": "json_object"})
    assert (
        isinstance(json.loads(obj.choices[0].message.content), dict)
        and _bodies(fake, "/api/chat")[-1]["format"] == "json"
    )


def test_openai_client_logprobs_streaming_and_not(oai):
    r = _ask(oai, "hi there", logprobs=True, top_logprobs=2, max_tokens=5)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert all(t.logprob < 0 and len(t.top_logprobs) == 2 and bytes(t.bytes).decode() == t.token for t in content)
    chunks = list(_ask(oai, "hi there", logprobs=True, top_logprobs=2, max_tokens=5, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    legacy = oai.completions.create(model="tiny", prompt="one two", max_tokens=4, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert "".join(lp.tokens) == legacy.choices[0].text and len(lp.token_logprobs) == 4
    assert all(len(d) == 2 for d in lp.top_logprobs)


@pytest.mark.parametrize(
    "version,kwargs,field",
    [
        ("0.12.3", {"logprobs": True}, "logprobs"),
        ("0.4.7", {"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_openai_client_on_an_older_ollama_gets_a_400_naming_the_field(oai, fake, version, kwargs, field):
    fake.state.version = version  # read when the model loads, on the first request
    with pytest.raises(openai.BadRequestError) as info:
        _ask(oai, "x", **kwargs)
    assert info.value.body["param"] == field and "ollama runtime" in info.value.message
    assert _ask(oai, "x", max_tokens=2).choices[0].message.content


def test_a_model_ollama_lists_without_tools_gets_a_400_naming_tools(fake, build_stack, live_factory):  # noqa: F811
    def planner(record):
        return Plan(runtime="ollama", n_ctx=1024, options={"ollama_host": fake.url})

    fake.state.models["tiny:latest"] = FakeModel("tiny:latest")
    url = live_factory(build_stack(planner=planner)).url
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        with pytest.raises(openai.BadRequestError) as info:
            _ask(client, "call get_weather", tools=[WEATHER])
        assert info.value.body["param"] == "tools"


def test_ollama_client_through_localrun_to_ollama(live_url, fake):
    client = ollama.Client(host=live_url, timeout=30)
    t = client.chat(model="tiny", messages=[{"role": "user", "content": "call get_weather"}], tools=[WEATHER])
    (call,) = t.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    history = [
        {"role": "user", "content": "call get_weather"},
        t.message.model_dump(exclude_none=True),
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    assert client.chat(model="tiny", messages=history, tools=[WEATHER], options={"num_predict": 3}).message.content
    assert _bodies(fake, "/api/chat")[-1]["messages"][2]["tool_name"] == "get_weather"
    j = client.chat(model="tiny", messages=[{"role": "user", "content": "x"}], format=PERSON)
    jsonschema.validate(json.loads(j.message.content), PERSON)
    lp = client.chat(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        logprobs=True,
        top_logprobs=2,
        options={"num_predict": 4},
    )
    assert len(lp.logprobs) == 4 and all(len(e.top_logprobs) == 2 for e in lp.logprobs)


def test_localrun_serve_process_with_ollama_forced(fake, spawn_server, tiny_gguf):  # noqa: F811
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

    ModelStore(Settings()).import_path(tiny_gguf, name="tiny")
    port = free_port()
    server = spawn_server(
        ["localrun", "serve", "--port", str(port), "--runtime", "ollama", "--no-default-model"],
        port=port,
        env={"OLLAMA_HOST": fake.url},
    )
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as client:
        r = _ask(client, "call get_weather", tools=[WEATHER], logprobs=True)
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].logprobs.content == []
        assert json.loads(r.choices[0].message.tool_calls[0].function.arguments)["unit"] == "C"
        schema = _ask(
            client, "who?", response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
        )
        jsonschema.validate(json.loads(schema.choices[0].message.content), PERSON)
        lp = _ask(client, "hi", logprobs=True, max_tokens=3).choices[0].logprobs.content
        assert len(lp) == 3 and all(t.top_logprobs == [] for t in lp)
        with pytest.raises(openai.BadRequestError) as info:
            _ask(client, "x", tools=[WEATHER], tool_choice="required")
        assert info.value.body["param"] == "tool_choice"
