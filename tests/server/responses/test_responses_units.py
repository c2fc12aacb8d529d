"""The Responses API's parts on their own: the conversation the model sees, the store's
bounds, a fuzz of request bodies (never a 500) and a disconnect stopping the worker."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localrun.errors import LocalrunError
from localrun.server.responses.convert import (
    conversation,
    decode_reasoning,
    encode_reasoning,
    parse_items,
    tool_choice,
    tool_set,
)
from localrun.server.responses.schemas import ResponsesRequest
from localrun.server.responses.store import MAX_CHAIN, PreviousNotFound, ResponseStore
from localrun.types import Message
from tests.support.servers import wait_until


def messages(raw, instructions=None):
    return conversation(parse_items(raw), instructions)


def test_instructions_and_leading_developer_items_become_one_system_message():
    got = messages(
        [
            {"role": "developer", "content": "a"},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "b"}]},
            {"role": "user", "content": "hi"},
            {"role": "developer", "content": "later"},
        ],
        instructions="top",
    )
    assert got == (Message("system", "top\n\na\n\nb"), Message("user", "hi"), Message("system", "later"))


def test_calls_and_outputs_become_one_assistant_turn_and_named_tool_turns():
    got = messages(
        [
            {"role": "user", "content": "go"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me look"}]},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "read",
                "namespace": "files",
                "arguments": '{"path": "a"}',
            },
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "function_call_output", "call_id": "c1", "output": "text of a"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "done"}]},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},  # a hosted tool's record: dropped
        ]
    )
    user, assistant, out1, out2 = got
    assert assistant.content == "let me look"
    assert [c["function"]["name"] for c in assistant.tool_calls] == ["files.read", "apply_patch"]
    assert json.loads(assistant.tool_calls[1]["function"]["arguments"]) == {"input": "*** Begin Patch"}
    assert (out1.role, out1.content, out1.tool_call_id, out1.name) == ("tool", "text of a", "c1", "files.read")
    assert (out2.content, out2.name) == ("done", "apply_patch")


def test_an_empty_conversation_gets_one_empty_user_turn():
    assert messages("") == (Message("user", ""),)
    assert messages(None, instructions="be brief") == (Message("system", "be brief"), Message("user", ""))


def test_reasoning_written_for_a_stateless_client_reads_back():
    blob = encode_reasoning("first I think")
    assert decode_reasoning(blob) == "first I think"
    assert decode_reasoning("gAAAAB-someone-elses-encrypted-blob") == ""
    # a reasoning item in history is accepted in every form (content, summary, encrypted only)
    for item in (
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": blob},
    ):
        got = messages(
            [{"role": "user", "content": "q"}, item, {"type": "message", "role": "assistant", "content": "a"}]
        )
        assert [m.role for m in got] == ["user", "assistant"] and got[1].content == "a"


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **fields})


def test_tools_of_each_type_are_served_as_functions():
    body = request(
        tools=[
            {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True, "defer_loading": False},
            {
                "type": "custom",
                "name": "apply_patch",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: X"},
            },
            {"type": "namespace", "name": "ns", "description": "d", "tools": [{"type": "function", "name": "g"}]},
            {"type": "web_search"},
            {"type": "file_search", "vector_store_ids": []},
        ]
    )
    tools = tool_set(body)
    assert [t["function"]["name"] for t in tools.tools] == ["f", "apply_patch", "ns.g"]
    custom = tools.tools[1]["function"]
    assert custom["parameters"]["required"] == ["input"] and "start: X" in custom["description"]
    assert tools.served["ns.g"].namespace == "ns" and tools.served["ns.g"].name == "g"
    assert tools.dropped == ["web_search", "file_search"]
    assert tool_choice(request(tool_choice={"type": "custom", "name": "apply_patch"}), tools) == {
        "type": "function",
        "function": {"name": "apply_patch"},
    }
    assert (
        tool_choice(request(tool_choice={"type": "function", "name": "g", "namespace": "ns"}), tools)["function"][
            "name"
        ]
        == "ns.g"
    )
    narrowed = tool_set(body)
    choice = tool_choice(
        request(
            tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "f"}]}
        ),
        narrowed,
    )
    assert choice == "required" and [t["function"]["name"] for t in narrowed.tools] == ["f"]


def test_store_keeps_a_chain_and_forgets_past_its_cap_and_age(tmp_path):
    store = ResponseStore(tmp_path / "r.sqlite3", max_stored=3)
    store.put(
        "r1", None, [{"role": "user", "content": "one"}], {"id": "r1", "output": [{"type": "message", "content": "a1"}]}
    )
    store.put(
        "r2", "r1", [{"role": "user", "content": "two"}], {"id": "r2", "output": [{"type": "message", "content": "a2"}]}
    )
    assert [i.get("content") for i in store.history("r2")] == ["one", "a1", "two", "a2"]
    assert store.get("r2")["id"] == "r2"
    for n in range(3, 6):
        time.sleep(0.002)  # distinct creation times
        store.put(f"r{n}", None, [], {"id": f"r{n}", "output": []})
    with pytest.raises(LocalrunError, match="no stored response"):
        store.get("r1")  # the oldest went over the cap
    assert store.get("r5")["id"] == "r5"
    aged = ResponseStore(tmp_path / "r.sqlite3", max_age_s=0.0)
    with pytest.raises(PreviousNotFound, match="r5"):
        aged.history("r5")
    assert store.delete("r5") and not store.delete("r5")


def test_a_chain_with_a_missing_link_is_an_error_naming_it(tmp_path):
    store = ResponseStore(tmp_path / "r.sqlite3")
    store.put("r2", "r1", [], {"id": "r2", "output": []})
    with pytest.raises(PreviousNotFound, match="'r1' .*an earlier link"):
        store.history("r2")
    store.put("loop", "loop", [], {"id": "loop", "output": []})
    with pytest.raises(LocalrunError, match=str(MAX_CHAIN)):
        store.history("loop")


# --- through the app ---------------------------------------------------------------------

FIELDS = sorted(
    set(ResponsesRequest.model_fields)
    | {
        "role",
        "content",
        "type",
        "call_id",
        "name",
        "arguments",
        "output",
        "text",
        "namespace",
        "summary",
        "encrypted_content",
        "parameters",
        "format",
        "mode",
        "input",
        "tools",
    }
)
leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(
        [
            "tiny",
            "message",
            "function_call",
            "user",
            "developer",
            "web_search",
            "function",
            "custom",
            "namespace",
            "json_schema",
            "auto",
            "required",
        ]
    ),
)
value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=24,
)
BASE = {"model": "tiny", "input": "hi", "max_output_tokens": 3}
KINDS = [
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "web_search_call",
    "function",
    "custom",
    "namespace",
    "web_search",
    "allowed_tools",
    "input_text",
    "input_image",
]


@pytest.fixture
def app_client(build_stack):  # noqa: F811
    from fastapi.testclient import TestClient

    from localrun.server.app import create_app
    from tests.support.stacks import fake_planner

    stack = build_stack(
        planner=fake_planner(fake_capabilities=["tools", "json_schema", "logprobs"]), runtime={"max_tokens_cap": 8}
    )
    with TestClient(
        create_app(stack.settings, stack.manager), base_url="http://localhost", raise_server_exceptions=False
    ) as c:
        yield c


def test_fuzzed_bodies_never_500(app_client):
    seen: set[int] = set()
    typed = st.builds(
        lambda kind, extra: {**extra, "type": kind},
        st.sampled_from(KINDS) | value,
        st.dictionaries(st.sampled_from(FIELDS), value, max_size=4),
    )
    bodies = st.one_of(
        value,
        st.builds(lambda k, v: {**BASE, k: v}, st.sampled_from(FIELDS), value),
        st.builds(lambda v: {**BASE, "input": [v]}, value | typed),
        st.builds(lambda v: {**BASE, "input": [{"role": "user", "content": [v]}]}, value | typed),
        st.builds(lambda v: {**BASE, "tools": [v]}, value | typed),
        st.builds(lambda v: {**BASE, "tools": [{"type": "namespace", "name": "n", "tools": [v]}]}, typed),
        st.builds(lambda v: {**BASE, "tool_choice": v}, value | typed),
    )

    @settings(
        max_examples=int(os.environ.get("LOCALRUN_FUZZ_EXAMPLES", 200)),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(body=bodies, stream=st.booleans())
    def run(body, stream) -> None:
        if isinstance(body, dict) and stream:
            body = {**body, "stream": True}
        r = app_client.post("/v1/responses", content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code < 500, (r.status_code, r.text[:500])
        seen.add(r.status_code)

    run()
    assert 400 in seen and 200 in seen
    for path in ("/v1/responses/resp_nope", "/v1/responses/%00", "/v1/responses/" + "x" * 5000):
        assert app_client.get(path).status_code == 404
        assert app_client.delete(path).status_code == 404


def test_client_disconnect_mid_stream_stops_the_generation(build_stack, live_factory):  # noqa: F811
    from tests.server.test_lifecycle import SLOW, in_flight

    stack = build_stack(options=SLOW)
    live = live_factory(stack)
    for body in ({"model": "tiny", "input": "go on", "stream": True}, {"model": "tiny", "input": "go on"}):
        try:
            # the stream gets a loaded machine's patience; the plain answer only half a second
            read = 10 if body.get("stream") else 0.5
            with httpx.stream("POST", f"{live.url}/v1/responses", json=body, timeout=httpx.Timeout(10, read=read)) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                assert [next(lines) for _ in range(8)]
                assert in_flight(stack) == 1
        except httpx.ReadTimeout:
            assert not body.get("stream")  # the non-streamed answer is 40 s away: the client gives up
        assert wait_until(lambda: in_flight(stack) == 0, 1.0), body


def test_an_error_after_the_stream_started_ends_it_with_response_failed():
    from localrun.errors import WorkerCrashed
    from localrun.server.responses.convert import ToolSet
    from localrun.server.responses.output import Draft, EventWriter

    writer = EventWriter(Draft("resp_1", "tiny", {}), ToolSet(), encrypted=False)
    events = writer.start() + writer.text("half an ans")
    data, response = writer.fail(WorkerCrashed("the worker of tiny died (signal 9)"))
    parsed = [json.loads(line[6:]) for line in (events + data).decode().splitlines() if line.startswith("data: ")]
    assert [e["sequence_number"] for e in parsed] == list(range(len(parsed)))
    assert parsed[-1]["type"] == "response.failed" and response["status"] == "failed"
    assert "signal 9" in response["error"]["message"] and response["error"]["code"]
