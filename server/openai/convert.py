"""OpenAI's chat wire to the core's types: messages (legacy ``function`` turns included) and tools
(legacy ``functions`` / ``function_call`` included). A request that cannot be met is a 400 here,
before any model loads."""

from __future__ import annotations

from typing import Any

from localrun.chat.media import MediaReader
from localrun.server.convert import message_content
from localrun.server.errors import InvalidRequest
from localrun.server.openai.schemas import ChatCompletionRequest
from localrun.server.schemas import CalledFunction
from localrun.types import Message

_ROLES = {"developer": "system"}


def core_messages(body: ChatCompletionRequest, reader: MediaReader | None = None) -> tuple[Message, ...]:
    """Core messages (media read by ``reader``, which keeps the request's count); a tool result
    without a ``name`` gets the one its call had, which some templates show.

    Legacy turns become tool turns: an assistant ``function_call`` is a ``tool_calls`` turn with
    one call whose id is ``call_<message index>`` (stable, so a repeated history renders the same
    prompt), and a ``role: "function"`` result is a ``tool`` turn answering the most recent
    unanswered call of its name (``tool_call_id`` None when there is none).
    """
    reader = reader or MediaReader()
    called: dict[str, str] = {}
    pending: list[tuple[str, str]] = []  # (id, name) of calls not answered yet, oldest first
    out = []
    for i, m in enumerate(body.messages):
        calls: tuple[dict[str, Any], ...] = tuple(
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in m.tool_calls or ()
        )
        if m.function_call is not None:
            calls = _legacy_history_call(i, m.role, m.function_call, calls)
        called.update((c["id"], c["function"]["name"]) for c in calls)
        pending.extend((c["id"], c["function"]["name"]) for c in calls)
        role, call_id = _ROLES.get(m.role, m.role), m.tool_call_id
        if m.role == "function":
            if m.name is None:
                raise InvalidRequest(
                    f"messages[{i}] has role 'function' but no 'name': name the function whose result it is",
                    param=f"messages[{i}].name",
                )
            role = "tool"
            if call_id is None:
                call_id = next((cid for cid, name in reversed(pending) if name == m.name), None)
        if m.tool_call_id is not None and m.tool_call_id not in called:
            # OpenAI's answer too: a result must answer a call an earlier assistant turn made.
            raise InvalidRequest(
                f"messages[{i}] has role 'tool' with tool_call_id {call_id!r}, which no earlier assistant "
                "turn's 'tool_calls' made: a tool message must answer a preceding message with 'tool_calls'",
                param=f"messages[{i}].tool_call_id",
                hint="send the assistant turn with its tool_calls before the tool results, with the same ids",
            )
        if call_id is not None and role == "tool":
            pending = [p for p in pending if p[0] != call_id]
        name = m.name if m.name is not None or role != "tool" else called.get(call_id or "")
        # An assistant turn's reasoning sent back (llama-server's interleaved thinking): the template decides.
        thought = (m.reasoning_content or m.reasoning or "") if role == "assistant" else ""
        text, media = message_content(m.content, f"messages[{i}]", reader)
        out.append(
            Message(role, text, tool_calls=calls, tool_call_id=call_id, name=name, reasoning=thought, media=media)
        )
    return tuple(out)


def _legacy_history_call(
    i: int, role: str, fn: CalledFunction, calls: tuple[dict[str, Any], ...]
) -> tuple[dict[str, Any], ...]:
    """The one tool call of an assistant turn that carries a legacy ``function_call``."""
    if role != "assistant":
        raise InvalidRequest(
            f"messages[{i}] has a 'function_call' but role {role!r}: only an assistant turn calls functions",
            param=f"messages[{i}].function_call",
        )
    if calls:
        raise InvalidRequest(
            f"messages[{i}] has both 'tool_calls' and 'function_call': send one of them",
            param=f"messages[{i}].function_call",
        )
    return ({"id": f"call_{i}", "type": "function", "function": {"name": fn.name, "arguments": fn.arguments}},)


def core_tools(body: ChatCompletionRequest) -> tuple[tuple[dict[str, Any], ...], object]:
    """(tools, tool_choice) for ChatRequest; a choice that cannot be met is a 400 before any load."""
    legacy = [f for f in ("functions", "function_call") if getattr(body, f) is not None]
    if legacy:
        return _legacy_tool_fields(body, legacy)
    tools = tuple(t.model_dump(exclude_none=True) for t in body.tools or ())
    choice = body.tool_choice
    if choice is not None and not isinstance(choice, str):
        names = {t["function"]["name"] for t in tools}
        if choice.function.name not in names:
            raise InvalidRequest(
                f"tool_choice names {choice.function.name!r}, which is not among 'tools'", param="tool_choice"
            )
        return tools, choice.model_dump()
    if choice == "required" and not tools:
        raise InvalidRequest("tool_choice 'required' needs at least one tool in 'tools'", param="tool_choice")
    return tools, choice


def _legacy_tool_fields(body: ChatCompletionRequest, legacy: list[str]) -> tuple[tuple[dict[str, Any], ...], object]:
    """``functions`` / ``function_call`` as (tools, tool_choice); mixed with ``tools`` / ``tool_choice`` it is a 400."""
    modern = [f for f in ("tools", "tool_choice") if getattr(body, f) is not None]
    if modern:
        raise InvalidRequest(
            f"{legacy[0]!r} and {modern[0]!r} cannot be combined: send either 'functions' and "
            "'function_call' (legacy) or 'tools' and 'tool_choice'",
            param=legacy[0],
        )
    tools: tuple[dict[str, Any], ...] = tuple(
        {"type": "function", "function": f.model_dump(exclude_none=True)} for f in body.functions or ()
    )
    choice = body.function_call
    if choice is not None and not isinstance(choice, str):
        if choice.name not in {t["function"]["name"] for t in tools}:
            raise InvalidRequest(
                f"function_call names {choice.name!r}, which is not among 'functions'", param="function_call"
            )
        return tools, {"type": "function", "function": {"name": choice.name}}
    return tools, choice
