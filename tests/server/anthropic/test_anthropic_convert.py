"""What an Anthropic request becomes for the model, and that what agents re-send each turn
renders the same prompt: the billing hash made constant, tools sorted, argument key order
kept, system turns inside messages in front until the first answer, then in place, consecutive turns joined."""

from __future__ import annotations

import json

import pytest

from localrun.server.anthropic.convert import core_messages, core_tool_choice, core_tools, stable_system_text
from localrun.server.anthropic.schemas import MessagesRequest
from localrun.server.errors import InvalidRequest


def body(**fields) -> MessagesRequest:
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 8, **fields})


def test_the_billing_header_line_is_dropped_and_nothing_else_changes():
    one = "x-anthropic-billing-header: cc_version=2.1.197.e3f; cc_entrypoint=cli; cch=1a2b3;"
    two = "x-anthropic-billing-header: cc_version=2.1.197.7c0; cc_entrypoint=sdk-cli; cch=9ffe0;"  # another session
    assert stable_system_text(one) == stable_system_text(two) == ""
    assert stable_system_text("talk about cch=123; freely") == "talk about cch=123; freely"  # only the header line
    assert stable_system_text(f"A\n\n{one}\n\nB") == "A\n\nB"
    assert stable_system_text(f"see x-anthropic-billing-header: {one}") == f"see x-anthropic-billing-header: {one}"
    system = [
        {"type": "text", "text": one},
        {"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}},
    ]
    first = core_messages(body(system=system))
    again = core_messages(body(system=[{"type": "text", "text": two}, system[1]]))
    assert first == again and first[0].role == "system" and first[0].content == "You are helpful."


def test_tools_are_sorted_and_call_arguments_keep_their_order():
    tools = [
        {"name": "Write", "input_schema": {"type": "object"}},
        {"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
    ]
    a = core_tools(body(tools=tools))
    assert [t["function"]["name"] for t in a] == ["Bash", "Write"] and a == core_tools(body(tools=tools[::-1]))
    call = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"z": 1, "a": {"y": 2, "b": 3}}}
    msgs = core_messages(
        body(
            messages=[
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [call]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done", "is_error": True}],
                },
            ]
        )
    )
    assert msgs[1].tool_calls[0]["function"]["arguments"] == json.dumps({"z": 1, "a": {"y": 2, "b": 3}})
    assert (msgs[2].role, msgs[2].tool_call_id, msgs[2].name, msgs[2].content) == (
        "tool",
        "toolu_1",
        "Bash",
        "Error: done",
    )
    with pytest.raises(InvalidRequest, match="share a name"):
        core_tools(body(tools=tools + tools[:1]))


def test_system_turns_join_the_front_until_the_first_answer_then_stay_in_place():
    """Claude Code's shape: its agent list comes as a system turn after the first question; the
    "tokens left" reminder after an answer."""
    turns = [
        {"role": "system", "content": "early"},
        {"role": "user", "content": "q1"},
        {"role": "system", "content": "agents: Explore, Plan"},
        {"role": "assistant", "content": "a1"},
        {"role": "system", "content": [{"type": "text", "text": "tokens left: 900"}]},
        {"role": "user", "content": "q2"},
    ]
    msgs = core_messages(body(system="S", messages=turns))
    assert [(m.role, m.content) for m in msgs] == [
        ("system", "S\n\nearly\n\nagents: Explore, Plan"),
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "tokens left: 900\n\nq2"),
    ]
    # the session's first request renders the same front as its later ones, so the prefix holds
    first = core_messages(body(system="S", messages=turns[:3]))
    assert first[0] == msgs[0] and first[1:] == (msgs[1],)
    # and the next session, another question, shares everything in front of it
    other = core_messages(body(system="S", messages=[turns[0], {"role": "user", "content": "q9"}, turns[2]]))
    assert other[0] == first[0] and other[1].content == "q9"


def test_thinking_history_is_accepted_and_not_rendered():
    msgs = core_messages(
        body(
            messages=[
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "secret", "signature": "s"},
                        {"type": "redacted_thinking", "data": "x"},
                        {"type": "text", "text": "answer"},
                    ],
                },
                {"role": "user", "content": "more"},
            ]
        )
    )
    assert [m.content for m in msgs] == ["q", "answer", "more"]


def test_tool_choice_and_refusals():
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    ts = core_tools(body(tools=tools))
    assert core_tool_choice(body(tools=tools, tool_choice={"type": "any"}), ts) == "required"
    assert core_tool_choice(body(tools=tools, tool_choice={"type": "tool", "name": "Bash"}), ts) == {
        "type": "function",
        "function": {"name": "Bash"},
    }
    assert core_tool_choice(body(tools=tools, tool_choice={"type": "none"}), ts) == "none"
    with pytest.raises(InvalidRequest, match="needs at least one tool"):
        core_tool_choice(body(tool_choice={"type": "any"}), ())
    with pytest.raises(InvalidRequest, match="built-in tool 'bash_20250124'"):
        core_tools(body(tools=[{"type": "bash_20250124", "name": "bash"}]))
    with pytest.raises(InvalidRequest, match="only system turns"):
        core_messages(body(messages=[{"role": "system", "content": "x"}]))
    with pytest.raises(InvalidRequest, match="tool_use block in a user turn"):
        core_messages(
            body(messages=[{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]}])
        )
    with pytest.raises(InvalidRequest, match="'search_result'"):
        core_messages(body(messages=[{"role": "user", "content": [{"type": "search_result", "source": "x"}]}]))
