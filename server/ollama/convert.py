"""Ollama's chat wire to the core's types and back: messages in (its tool calls carry arguments as
objects, often without an id), the core's OpenAI-shaped calls out."""

from __future__ import annotations

from localrun.chat.tool_calls import arguments_object, openai_calls
from localrun.server.ollama.schemas import ChatBody
from localrun.types import Message


def core_messages(body: ChatBody) -> tuple[Message, ...]:
    """Core messages: Ollama's calls (arguments as objects, often no id) in OpenAI's shape."""
    out = []
    for m in body.messages or ():
        calls = tuple(openai_calls([c.model_dump() for c in m.tool_calls or ()]))
        out.append(Message(m.role, m.content or "", tool_calls=calls, tool_call_id=m.tool_call_id, name=m.tool_name))
    return tuple(out)


def ollama_tool_calls(calls) -> list[dict]:
    """OpenAI-shaped calls as Ollama writes them: arguments as an object."""
    out = []
    for i, c in enumerate(calls):
        fn = c["function"]
        args = arguments_object(fn["arguments"])
        if isinstance(args, str):  # not JSON: Ollama's clients expect an object
            args = {}
        out.append({"id": c.get("id"), "function": {"index": i, "name": fn["name"], "arguments": args}})
    return out
