"""An Anthropic Messages request as the core's ChatRequest: the one translation both
``/v1/messages`` and ``count_tokens`` use, so a count is the rendering the request gets.

Rules, each chosen so that what an agent re-sends every turn renders to the same prompt
(the prefix cache then keeps it; see "Agents' prefix cache" in docs/architecture.md):

* ``system`` (a string or text blocks) is one system turn, blocks joined by a blank line.
  Claude Code's first block, ``x-anthropic-billing-header: cc_version=<v>.<hex>;
  cc_entrypoint=…; cch=<hex>;``, is dropped (:func:`stable_system_text`): it is billing
  metadata that means nothing to the model, its ``cch`` changes on every request and the
  suffix of ``cc_version`` with the conversation's content, so kept (or with only ``cch``
  made constant, as before) it made every new session's prompt differ from its tenth token
  on and no prefix could be shared across sessions.
* ``role: "system"`` turns inside ``messages`` (Claude Code ≥ 2.1 sends them) join the
  system prompt until the first assistant turn; later ones become user text in place.
  What comes before the first answer is a session's set-up and never changes in its later
  requests, so joining it to the front keeps every turn's prefix; Claude Code's agent list
  comes there, after the user's question, and is the same in every session of a project:
  in front, a new session's prompt is shared up to the question (19.2k of 19.3k tokens, not
  17.8k: bench_kv_disk). A system turn after an answer (Claude Code's "tokens left" after a
  tool call) would change the front on every turn if hoisted, the cache breakage Ollama's
  hoisting caused; and many templates (Qwen, Gemma) refuse a system turn after the first.
* Consecutive turns of one role are joined, as Anthropic's API does.
* ``tool_use`` blocks are OpenAI-shaped calls whose arguments keep the client's key order
  (a dict in, the same JSON out); ``tool_result`` blocks are ``tool`` turns naming their call.
  ``is_error`` results are prefixed ``Error:``.
* Tools are sorted by name: an agent reconnecting its MCP servers may list them in another
  order, which means nothing but would change the prompt.
* ``image`` blocks (``base64`` with its ``media_type``, or a ``url``, fetched only from allowed
  hosts) are the turn's media, each a media marker where the block stood, the text blocks around
  them joined by a blank line as always; an image inside a ``tool_result`` (Claude Code returns
  screenshots that way) is media of that tool turn.
* An assistant turn's ``thinking`` blocks are its reasoning (``Message.reasoning``), which
  reaches the template as ``reasoning_content``, as llama-server passes it: a reasoning model's
  template keeps it within a tool-use loop (Anthropic keeps thinking there too) and drops it
  from turns before the last user message by itself; a template that does not render it drops
  it. ``count_tokens`` counts what the template keeps. ``redacted_thinking`` (encrypted by
  Anthropic, unreadable here) is accepted and left out.
"""

from __future__ import annotations

import json
import re
from typing import Any

from localrun.chat.media import MediaReader
from localrun.chat.media_formats import IMAGE
from localrun.server.anthropic.schemas import (
    CountTokensRequest,
    ImageBlock,
    MessageParam,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from localrun.server.errors import InvalidRequest
from localrun.types import MEDIA_MARKER, Media, Message, strip_media_markers

_BILLING = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n+|\Z)", re.MULTILINE)


def stable_system_text(text: str) -> str:
    """The system text without Claude Code's billing header line (see the module doc)."""
    return _BILLING.sub("", text)


def _blocks_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return strip_media_markers(content)
    return "\n\n".join(strip_media_markers(b.text) for b in content if getattr(b, "type", None) == "text")


def system_text(body: CountTokensRequest) -> str:
    return stable_system_text(_blocks_text(body.system))


def image_media(block: ImageBlock, where: str, reader: MediaReader) -> Media:
    """An image block's file: inline base64, or a URL the server may fetch; a Files API id is a 400."""
    source = block.source
    if source.type == "base64":
        return reader.base64(source.data, where, expect=IMAGE, declared=source.media_type)
    if source.type == "url":
        return reader.url(source.url, where, expect=IMAGE)
    raise InvalidRequest(
        f"{where} refers to an uploaded file ({source.file_id[:64]!r}): localrun has no Files API",
        hint="send the image inline (source type base64)",
        param=f"{where}.source",
    )


def _tool_result(block: ToolResultBlock, where: str, reader: MediaReader) -> tuple[str, tuple[Media, ...]]:
    """A result's text (``Error:`` first for an error) and images, each a marker where it stood."""
    content = block.content
    media: tuple[Media, ...]
    if content is None or isinstance(content, str):
        text, media = _blocks_text(content), ()
    else:
        parts, found = [], []
        for k, part in enumerate(content):
            if part.type == "text":
                parts.append(strip_media_markers(part.text))
            elif part.type == "image":
                found.append(image_media(part, f"{where}.content[{k}]", reader))
                parts.append(MEDIA_MARKER)
        text, media = "\n\n".join(parts), tuple(found)
    return (f"Error: {text}" if block.is_error else text), media


def _tool_call(where: str, role: str, block: ToolUseBlock, names: dict[str, str]) -> dict[str, Any]:
    """A ``tool_use`` block as an OpenAI-shaped call (its id remembered with its name, for the result)."""
    if role != "assistant":
        raise InvalidRequest(
            f"{where} is a tool_use block in a {role} turn: only the assistant calls tools", param=where
        )
    names[block.id] = block.name
    arguments = json.dumps(block.input, ensure_ascii=False)
    return {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}


def _result_turn(where: str, role: str, block: ToolResultBlock, names: dict[str, str], reader: MediaReader) -> Message:
    """A ``tool_result`` block as a tool turn, named after the call it answers."""
    if role != "user":
        raise InvalidRequest(
            f"{where} is a tool_result block in a {role} turn: results come back in a user turn", param=where
        )
    if block.tool_use_id not in names:  # Anthropic's answer too
        raise InvalidRequest(
            f"{where}: unexpected tool_use_id {block.tool_use_id!r} in a tool_result block: each tool_result "
            "block must answer a tool_use block of an earlier assistant turn",
            param=f"{where}.tool_use_id",
            hint="send the assistant turn with its tool_use blocks before the results, with the same ids",
        )
    text, shown = _tool_result(block, where, reader)
    return Message("tool", text, tool_call_id=block.tool_use_id, name=names.get(block.tool_use_id), media=shown)


def _turns(i: int, m: MessageParam, names: dict[str, str], reader: MediaReader) -> list[Message]:
    """The core messages of one Anthropic turn (tool results first, then the text)."""
    if isinstance(m.content, str):
        return [Message(m.role, strip_media_markers(m.content))]
    media: list[Media] = []
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[Message] = []
    for j, block in enumerate(m.content):
        kind = block.type
        if isinstance(block, TextBlock):
            texts.append(strip_media_markers(block.text))
        elif isinstance(block, ImageBlock):
            media.append(image_media(block, f"messages[{i}].content[{j}]", reader))
            texts.append(MEDIA_MARKER)
        elif isinstance(block, ToolUseBlock):  # tool_use, server_tool_use
            calls.append(_tool_call(f"messages[{i}].content[{j}]", m.role, block, names))
        elif isinstance(block, ToolResultBlock):
            results.append(_result_turn(f"messages[{i}].content[{j}]", m.role, block, names, reader))
        elif isinstance(block, ThinkingBlock):
            if m.role == "assistant" and block.thinking:
                thoughts.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            continue  # encrypted reasoning: accepted, not rendered (see the module doc)
        elif kind != "document":  # refused by capability (no runtime declares "documents")
            raise InvalidRequest(
                f"messages[{i}].content[{j}] has block type {kind!r}, which localrun does not serve",
                hint="send text, tool_use, tool_result or thinking blocks",
                param=f"messages[{i}].content[{j}].type",
            )
    out = results
    if texts or calls or thoughts or not results:
        out.append(
            Message(
                m.role,
                "\n\n".join(texts),
                tool_calls=tuple(calls),
                reasoning="\n\n".join(thoughts),
                media=tuple(media),
            )
        )
    return out


def _join(a: Message, b: Message) -> Message:
    text = "\n\n".join(t for t in (a.content, b.content) if t)
    reasoning = "\n\n".join(t for t in (a.reasoning, b.reasoning) if t)
    return Message(a.role, text, tool_calls=a.tool_calls + b.tool_calls, reasoning=reasoning, media=a.media + b.media)


def core_messages(body: CountTokensRequest, reader: MediaReader | None = None) -> tuple[Message, ...]:
    """The conversation as core messages: the system turn first, then the turns in order (media read
    by ``reader``, which keeps the request's count)."""
    reader = reader or MediaReader()
    system = [system_text(body)] if body.system else []
    names: dict[str, str] = {}
    out: list[Message] = []
    answered = False  # an assistant turn came: system turns from here on stay in place
    for i, m in enumerate(body.messages):
        answered = answered or m.role == "assistant"
        if m.role == "system":
            if not isinstance(m.content, str) and any(b.type != "text" for b in m.content):
                raise InvalidRequest(
                    f"messages[{i}] is a system turn with non-text blocks: a system prompt is text",
                    hint="put images in a user turn",
                    param=f"messages[{i}].content",
                )
            text = _blocks_text(m.content)
            if not answered:
                system.append(stable_system_text(text))
                continue
            m = MessageParam(role="user", content=text)
        for msg in _turns(i, m, names, reader):
            if out and msg.role == out[-1].role and msg.role != "tool":
                out[-1] = _join(out[-1], msg)
            else:
                out.append(msg)
    if not out:
        raise InvalidRequest("'messages' holds only system turns: send at least one user turn", param="messages")
    if out[-1].role == "assistant":
        raise InvalidRequest(
            "the last turn is the assistant's: continuing a prefilled answer is not supported",
            hint="end 'messages' with a user turn",
            param=f"messages[{len(body.messages) - 1}]",
        )
    head = [Message("system", "\n\n".join(t for t in system if t))] if any(system) else []
    return tuple(head + out)


def core_tools(body: CountTokensRequest) -> tuple[dict[str, Any], ...]:
    """Client tools as OpenAI-shaped definitions, sorted by name; Anthropic's own tools are refused."""
    tools: list[dict[str, Any]] = []
    for i, t in enumerate(body.tools or ()):
        if t.type not in (None, "custom"):
            raise InvalidRequest(
                f"tools[{i}] is Anthropic's server or built-in tool {t.type!r}, which a local model cannot run",
                hint="define it as a client tool with an input_schema",
                param=f"tools[{i}].type",
            )
        fn: dict[str, Any] = {"name": t.name, "parameters": t.input_schema or {"type": "object", "properties": {}}}
        if t.description:
            fn["description"] = t.description
        tools.append({"type": "function", "function": fn})
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise InvalidRequest("two tools share a name: tool names must be unique", param="tools")
    return tuple(sorted(tools, key=lambda t: t["function"]["name"]))


def core_tool_choice(body: CountTokensRequest, tools: tuple[dict[str, Any], ...]) -> Any:
    choice = body.tool_choice
    if choice is None:
        return None
    if choice.type in ("any", "tool") and not tools:
        raise InvalidRequest(f"tool_choice {choice.type!r} needs at least one tool in 'tools'", param="tool_choice")
    if choice.type == "tool":
        if choice.name is None:
            raise InvalidRequest("tool_choice of type 'tool' needs a 'name'", param="tool_choice.name")
        if choice.name not in {t["function"]["name"] for t in tools}:
            raise InvalidRequest(
                f"tool_choice names {choice.name!r}, which is not among 'tools'", param="tool_choice.name"
            )
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]
