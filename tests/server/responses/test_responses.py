"""The official ``openai`` client's ``client.responses`` against a real ``localrun serve``
process on the fake runtime (every optional capability declared): shapes, streams, tools,
stored conversations, structured output, Codex's request as captured, and refusals."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from localrun.server.responses.convert import decode_reasoning
from tests.support.clients import client_for, validate

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_create_answers_with_a_message_and_usage(oai):
    r = oai.responses.create(model="tiny", input="hello there", max_output_tokens=6, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny"
    assert r.output_text.startswith("You said: hello there.")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert r.usage.output_tokens == 6 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + 6
    assert r.temperature == 0 and r.store is True


def test_stream_events_are_typed_numbered_and_join_to_the_created_answer(oai):
    kwargs = dict(
        model="tiny",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "count with me"}]}],
        max_output_tokens=200,
        temperature=0,
    )
    whole = oai.responses.create(**kwargs)
    with oai.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all(d.item_id == final.output[0].id for d in deltas)
    assert "".join(d.delta for d in deltas) == final.output_text == whole.output_text
    assert final.status == "completed" and final.usage.output_tokens == whole.usage.output_tokens
    assert events[-1].response.output[0].content[0].text == final.output_text  # completed carries the whole output


def test_function_tool_round_trip(oai):
    first = oai.responses.create(model="tiny", input="call get_weather", tools=[WEATHER])
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert (
        call.name == "get_weather" and call.call_id.startswith("call_") and json.loads(call.arguments) == {"city": ""}
    )
    history = [
        {"role": "user", "content": "call get_weather"},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ]
    second = oai.responses.create(model="tiny", input=history, tools=[WEATHER], tool_choice="none", store=False)
    assert second.status == "completed" and second.output_text.startswith("You said: call get_weather.")
    alone = oai.responses.create(model="tiny", input=history[:1], tools=[WEATHER], tool_choice="none", store=False)
    assert second.usage.input_tokens > alone.usage.input_tokens + 4  # the call and its result reached the prompt


def test_streamed_function_call_events(oai):
    with oai.responses.stream(
        model="tiny", input="call get_weather", tools=[WEATHER], tool_choice="required"
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments and done.item_id == call.id


def test_previous_response_id_continues_a_stored_conversation(oai):
    first = oai.responses.create(model="tiny", input="my name is Ada", max_output_tokens=4, temperature=0)
    fresh = oai.responses.create(model="tiny", input="what is my name", max_output_tokens=4, temperature=0, store=False)
    second = oai.responses.create(
        model="tiny", input="what is my name", previous_response_id=first.id, max_output_tokens=4, temperature=0
    )
    assert second.previous_response_id == first.id
    # the stored turn (its input and answer) is replayed before the new input
    assert second.usage.input_tokens > fresh.usage.input_tokens + first.usage.output_tokens
    assert oai.responses.retrieve(first.id).output_text == first.output_text
    third = oai.responses.create(model="tiny", input="and again", previous_response_id=second.id, max_output_tokens=4)
    assert third.usage.input_tokens > second.usage.input_tokens  # chains of stored responses are walked to their start
    with pytest.raises(openai.NotFoundError, match="previous response"):
        oai.responses.create(model="tiny", input="x", previous_response_id=fresh.id)  # store false kept nothing
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(fresh.id)


def test_delete_forgets_a_response(oai):
    r = oai.responses.create(model="tiny", input="x", max_output_tokens=2)
    oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.delete(r.id)


def test_json_schema_output_is_valid(oai):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = oai.responses.create(
        model="tiny",
        input="a person",
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
    )
    validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


def test_custom_and_namespace_tools_are_served_and_named_back(oai):
    patch = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Apply a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
    }
    r = oai.responses.create(model="tiny", input="call apply_patch", tools=[patch])
    (call,) = r.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == ""
    ns = {
        "type": "namespace",
        "name": "files",
        "description": "File tools.",
        "tools": [
            {
                "type": "function",
                "name": "read",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
        ],
    }
    r = oai.responses.create(model="tiny", input="call files.read", tools=[ns, {"type": "web_search"}])
    (call,) = r.output
    assert call.type == "function_call" and call.name == "read" and call.namespace == "files"
    # the namespaced call as history is read back (name and namespace joined again)
    history = [
        {"role": "user", "content": "x"},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "hi"},
    ]
    back = oai.responses.create(model="tiny", input=history, tools=[ns], tool_choice="none", max_output_tokens=3)
    assert back.output_text.startswith("You said: x")


CODEX_REQUEST = {
    "model": "tiny",
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "<permissions>sandboxed</permissions>"}],
        },
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "<environment_context>cwd</environment_context>"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]},
    ],
    "tools": [
        {
            "type": "function",
            "name": "exec_command",
            "description": "Run a command.",
            "strict": False,
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
        {
            "type": "namespace",
            "name": "mcp__docs__",
            "description": "Docs server.",
            "tools": [{"type": "function", "name": "search", "parameters": {"type": "object", "properties": {}}}],
        },
        {"type": "web_search", "external_web_access": False},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0198-session",
    "client_metadata": {"installation_id": "x"},
}


def test_codex_request_as_captured_streams_to_completed(fake_server):
    events = []
    with httpx.stream("POST", f"{fake_server.url}/v1/responses", json=CODEX_REQUEST, timeout=30) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert all("type" in e and "sequence_number" in e for e in events)
    assert events[0]["type"] == "response.created" and events[0]["response"]["status"] == "in_progress"
    assert events[-1]["type"] == "response.completed"
    done = events[-1]["response"]
    assert done["output"] and done["output"][0]["content"][0]["text"].startswith("You said: say hi.")
    assert done["usage"]["input_tokens"] > 0
    assert all(e["item_id"] for e in events if e["type"].endswith(".delta"))


@pytest.mark.parametrize("body", [{"input": ""}, {"input": []}, {}, {"input": "hi", "max_output_tokens": 1}])
def test_probe_requests_succeed(oai, body):
    r = oai.responses.create(
        model="tiny", max_output_tokens=1, **{k: v for k, v in body.items() if k != "max_output_tokens"}
    )
    assert r.status in ("completed", "incomplete") and r.usage.output_tokens <= 1


def test_bad_requests_name_what_was_wrong(oai):
    cases = [
        (dict(input=[{"type": "telepathy", "text": "x"}]), "input[0].type", "known types"),
        (dict(input="x", tools=[{"type": "function", "name": "bad name!"}]), "tools[0].name", "pattern"),
        (dict(input="x", tool_choice={"type": "web_search_preview"}), "tool_choice.type", "hosted"),
        (
            dict(input="x", tools=[WEATHER], tool_choice={"type": "function", "name": "nope"}),
            "tool_choice.name",
            "nope",
        ),
        (dict(input="x", include=["everything"]), "include[0]", "known values"),
        (dict(input="x", background=True), "background", "fake runtime"),
        (dict(input="x", truncation="auto"), "truncation", "not supported"),
    ]
    for kwargs, param, words in cases:
        with pytest.raises(openai.BadRequestError) as info:
            oai.responses.create(model="tiny", **kwargs)
        error = info.value.body
        assert error["param"] == param, (kwargs, error)
        assert words in error["message"], (kwargs, error)
    with pytest.raises(openai.NotFoundError, match="ghost"):
        oai.responses.create(model="ghost", input="x")


def test_an_unknown_top_level_field_is_ignored_and_named_in_the_header(oai):
    """The field policy of every route (server/fields.py): accepted, ignored, named."""
    raw = oai.responses.with_raw_response.create(model="tiny", input="x", max_output_tokens=2, extra_body={"bogus": 1})
    assert raw.headers.get("X-Localrun-Ignored-Fields") == "bogus"
    assert raw.parse().status in ("completed", "incomplete")


def test_a_runtime_without_tools_or_schemas_refuses_them_by_name(bare_server):
    with client_for(bare_server) as oai:
        for kwargs, param in (
            (dict(tools=[WEATHER]), "tools"),
            (dict(text={"format": {"type": "json_object"}}), "text.format"),
            (dict(top_logprobs=2), "top_logprobs"),
        ):
            with pytest.raises(openai.BadRequestError, match="fake runtime") as info:
                oai.responses.create(model="tiny", input="x", **kwargs)
            assert info.value.body["param"] == param
        # hosted tools alone are dropped, so they need nothing of the runtime
        r = oai.responses.create(model="tiny", input="x", tools=[{"type": "web_search"}], max_output_tokens=2)
        assert r.output_text and r.tools[0].type == "web_search"


@pytest.fixture(scope="module")
def r1_server(tmp_path_factory):
    """The fake runtime playing a reasoning model (a Qwen3-like template, five words of reasoning)."""
    from tests.factories import write_tiny_llama_gguf
    from tests.server.test_reasoning import THINK_TEMPLATE
    from tests.support.servers import start_in_home

    model = write_tiny_llama_gguf(tmp_path_factory.mktemp("r1") / "tiny-r1.gguf", chat_template=THINK_TEMPLATE)
    server = start_in_home(
        tmp_path_factory.mktemp("resp-r1"),
        model,
        "r1",
        fake_capabilities=["tools", "reasoning_budget"],
        fake_think_words=5,
        fake_reply_words=3,
    )
    yield server
    server.stop()


def test_reasoning_becomes_a_reasoning_item_streamed_and_not(r1_server):
    with client_for(r1_server) as oai:
        r = oai.responses.create(model="r1", input="hello", include=["reasoning.encrypted_content"], temperature=0)
        reasoning, message = r.output
        assert reasoning.type == "reasoning" and reasoning.content[0].type == "reasoning_text"
        thought = reasoning.content[0].text
        assert thought.split() == "the quick brown fox jumps".split() and "<think>" not in r.output_text
        assert r.output_text.startswith("You said: hello.")
        assert r.usage.output_tokens_details.reasoning_tokens > 0
        assert decode_reasoning(reasoning.encrypted_content) == thought  # readable by localrun, by no one else's key
        with oai.responses.stream(model="r1", input="hello", temperature=0) as stream:
            events = list(stream)
            final = stream.get_final_response()
        kinds = [e.type for e in events]
        assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought
        assert final.output[0].content[0].text == thought and final.output_text == r.output_text
        # a stateless client sends the reasoning back, encrypted_content and all: accepted
        back = oai.responses.create(
            model="r1",
            input=[
                {"role": "user", "content": "hello"},
                reasoning.model_dump(exclude_none=True),
                message.model_dump(exclude_none=True),
                {"role": "user", "content": "more"},
            ],
        )
        assert back.output_text.startswith("You said: more.")
        off = oai.responses.create(model="r1", input="hello", reasoning={"effort": "none"})
        assert [o.type for o in off.output] == ["message"]  # effort none: the reasoning is closed before it starts
