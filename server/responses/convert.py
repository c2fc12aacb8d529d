"""Responses API input → the core's ChatRequest pieces, and the model's calls → Responses items.

**Conversation.** ``instructions`` and the leading ``system``/``developer`` items become one
system message (Codex sends two developer items, and Qwen-style templates reject a
second system message); a later ``system``/``developer`` item stays a system turn where
it was. Consecutive assistant output (a message, ``function_call`` and
``custom_tool_call`` items) is one assistant turn with ``tool_calls``; a call's output is a
``tool`` turn named after its call. Reasoning items ride with the next assistant turn as
its ``Message.reasoning``, which reaches the template as ``reasoning_content`` (a reasoning
model's template keeps it within a tool loop and drops older turns' itself). Hosted-tool
items were dropped by the schema. A conversation with no turn at all (a probe) gets one
empty user turn, so every template renders.

**Tools.** ``function`` tools pass through; a ``custom`` tool (Codex's ``apply_patch``) is
offered as a function with one string argument ``input``, its grammar (if any) written
into the description — described to the model, not enforced; a ``namespace`` tool's
members are offered as ``<namespace>.<name>`` functions, and a call of one is answered
with ``name`` and ``namespace`` apart, as OpenAI does. Hosted tools are dropped; forcing
one with ``tool_choice`` is a 400.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any, cast

from localrun.chat.media import MediaReader
from localrun.chat.media_formats import AUDIO, IMAGE
from localrun.server.errors import InvalidRequest
from localrun.server.responses.schemas import (
    DROPPED_ITEMS,
    HOSTED_TOOLS,
    ITEM_TYPES,
    TOOL_TYPES,
    CallOutputItem,
    CustomTool,
    CustomToolCallItem,
    FunctionCallItem,
    FunctionTool,
    MessageItem,
    NamedChoice,
    NamespaceTool,
    ReasoningItem,
    ResponsesRequest,
    parse_typed,
)
from localrun.types import MEDIA_MARKER, Media, Message, strip_media_markers

log = logging.getLogger(__name__)

CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "the tool's whole input"}},
    "required": ["input"],
    "additionalProperties": False,
}
_MESSAGE_FIELDS = {f.name for f in dataclasses.fields(Message)}


@dataclass(frozen=True)
class Served:
    """How one offered function maps back to a Responses tool."""

    kind: str  # "function" | "custom"
    name: str
    namespace: str | None = None


@dataclass
class ToolSet:
    """The tools offered to the model (OpenAI chat shape) and how each maps back."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    served: dict[str, Served] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)

    def add(self, tool: FunctionTool | CustomTool, namespace: str | None, where: str) -> None:
        qualified = tool.name if not namespace or tool.name.startswith(namespace + ".") else f"{namespace}.{tool.name}"
        if qualified in self.served:
            raise InvalidRequest(f"{where} repeats the tool name {qualified!r}", param=where)
        short = qualified[len(namespace) + 1 :] if namespace else qualified
        if isinstance(tool, CustomTool):
            self.served[qualified] = Served("custom", short, namespace)
            fn = {"name": qualified, "description": _custom_description(tool), "parameters": CUSTOM_PARAMETERS}
        else:
            self.served[qualified] = Served("function", short, namespace)
            fn = {"name": qualified, "parameters": tool.parameters or {"type": "object", "properties": {}}}
            if tool.description:
                fn["description"] = tool.description
        self.tools.append({"type": "function", "function": fn})


def _custom_description(tool: CustomTool) -> str:
    text = tool.description or ""
    fmt = tool.format
    if fmt is not None and fmt.type == "grammar" and fmt.definition:
        text += f"\n\nThe input must follow this {fmt.syntax or 'lark'} grammar:\n{fmt.definition}"
    return text.strip()


def tool_set(body: ResponsesRequest) -> ToolSet:
    out = ToolSet()
    for i, raw in enumerate(body.tools or ()):
        tool = parse_typed(raw, TOOL_TYPES, HOSTED_TOOLS, f"tools[{i}]")
        if tool is None:
            out.dropped.append(str(raw.get("type")))
        elif isinstance(tool, NamespaceTool):
            for j, member in enumerate(tool.tools):
                inner = parse_typed(
                    member, {"function": FunctionTool, "custom": CustomTool}, HOSTED_TOOLS, f"tools[{i}].tools[{j}]"
                )
                if inner is not None:
                    out.add(cast("FunctionTool | CustomTool", inner), tool.name, f"tools[{i}].tools[{j}]")
        else:
            out.add(cast("FunctionTool | CustomTool", tool), None, f"tools[{i}]")
    if out.dropped:
        log.info("responses: dropped hosted tools localrun does not run: %s", ", ".join(out.dropped))
    return out


def tool_choice(body: ResponsesRequest, tools: ToolSet) -> Any:
    """The chat-shaped tool_choice; ``allowed_tools`` narrows ``tools`` in place."""
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        if choice == "required" and not tools.tools:
            raise InvalidRequest(
                "tool_choice 'required' needs at least one function, custom or namespace tool", param="tool_choice"
            )
        return choice
    if choice.type == "allowed_tools":
        return _allowed(choice, tools)
    if choice.type in ("function", "custom"):
        name = _qualified(choice.name or "", choice.namespace)
        if name not in tools.served:
            raise InvalidRequest(f"tool_choice names {name!r}, which is not among 'tools'", param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    hosted = choice.type in HOSTED_TOOLS or choice.type in ("mcp", "shell", "apply_patch")
    why = "a hosted tool localrun does not run" if hosted else "not a tool type localrun knows"
    raise InvalidRequest(
        f"tool_choice forces {choice.type!r}, {why}", hint="offer a function tool instead", param="tool_choice.type"
    )


def _qualified(name: str, namespace: str | None) -> str:
    return f"{namespace}.{name}" if namespace and not name.startswith(namespace + ".") else name


def _allowed(choice: NamedChoice, tools: ToolSet) -> Any:
    allowed = set()
    for t in choice.tools or ():
        if isinstance(t, dict) and t.get("type") in ("function", "custom") and isinstance(t.get("name"), str):
            namespace = t.get("namespace")
            allowed.add(_qualified(t["name"], namespace if isinstance(namespace, str) else None))
    tools.tools[:] = [t for t in tools.tools if t["function"]["name"] in allowed]
    if choice.mode == "required" and not tools.tools:
        raise InvalidRequest(
            "tool_choice allowed_tools with mode 'required' allows none of 'tools'", param="tool_choice.tools"
        )
    return choice.mode or "auto"


# --- the conversation ---------------------------------------------------------------------


def parse_items(raw: str | list[Any] | None, where: str = "input") -> list[tuple[str, Any]]:
    """(place, typed item) for each item of ``input`` (a string is one user message); dropped kinds are left out."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [(where, MessageItem(role="user", content=raw))]
    items = []
    for i, value in enumerate(raw):
        item = parse_typed(value, ITEM_TYPES, DROPPED_ITEMS, f"{where}[{i}]")
        if item is None:
            log.debug("responses: dropped a %r item (hosted-tool record)", value.get("type"))
        else:
            items.append((f"{where}[{i}]", item))
    return items


def item_content(content: Any, where: str, reader: MediaReader) -> tuple[str, tuple[Media, ...]]:
    """The text and media of message content or a tool output: a string, or parts — text parts
    joined, each ``input_image`` / ``input_audio`` a media marker where it stood (``input_file`` is
    refused by capability earlier)."""
    if isinstance(content, str):
        return strip_media_markers(content), ()
    parts: list[str] = []
    media: list[Media] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise InvalidRequest(f"{where}[{j}] must be an object", param=f"{where}[{j}]")
        kind = part.get("type")
        text = part.get("refusal") if kind == "refusal" else part.get("text")
        if kind in ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text") and isinstance(
            text, str
        ):
            parts.append(strip_media_markers(text))
        elif kind in ("input_image", "input_audio"):
            media.append(_media_part(part, f"{where}[{j}]", reader))
            parts.append(MEDIA_MARKER)
        elif kind != "input_file":
            raise InvalidRequest(
                f"{where}[{j}] has type {kind!r} or no text; text parts are input_text, output_text, refusal",
                param=f"{where}[{j}].type",
            )
    return "".join(parts), tuple(media)


def _media_part(part: dict[str, Any], where: str, reader: MediaReader) -> Media:
    """``input_image`` (``image_url``: a data: URL, or a URL the server may fetch; ``detail`` accepted)
    or ``input_audio`` (``{data, format}`` as in chat)."""
    if part.get("type") == "input_audio":
        clip = part.get("input_audio")
        if not isinstance(clip, dict) or not isinstance(clip.get("data"), str):
            raise InvalidRequest(f"{where} needs input_audio.data (base64)", param=f"{where}.input_audio")
        fmt = clip.get("format") if isinstance(clip.get("format"), str) else None
        return reader.base64(clip["data"], where, expect=AUDIO, declared=fmt)
    url = part.get("image_url")
    if url is None and part.get("file_id") is not None:
        raise InvalidRequest(
            f"{where} refers to an uploaded file: localrun has no Files API",
            hint="send the image inline as image_url (a data: URL)",
            param=f"{where}.file_id",
        )
    if isinstance(url, dict):  # the chat shape, which some clients send here too
        url = url.get("url")
    return reader.url(url, where, expect=IMAGE)


def needs(items: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """(field, capability) for history a runtime must support: tool turns and file parts (images and
    audio need what they hold: the MediaReader's ``needs``)."""
    caps = {"input_file": "files"}
    found = []
    for where, item in items:
        if isinstance(item, (FunctionCallItem, CustomToolCallItem, CallOutputItem)):
            found.append((where, "tools"))
        content = item.content if isinstance(item, MessageItem) else getattr(item, "output", None)
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind in caps:
                    found.append((f"{where}.content[{j}]", caps[kind]))
    return found


class _Builder:
    """Folds items into core messages; the rules are in the module docstring."""

    def __init__(self, instructions: str | None, reader: MediaReader):
        self.reader = reader
        self.system: list[str] = [strip_media_markers(instructions)] if instructions else []
        self.system_media: list[Media] = []
        self.messages: list[Message] = []
        self.calls: list[dict[str, Any]] = []
        self.text: list[str] = []
        self.media: list[Media] = []
        self.reasoning: list[str] = []
        self.names: dict[str, str] = {}
        self.assistant = False

    def flush(self) -> None:
        if self.assistant:
            extra = {"reasoning": "".join(self.reasoning)} if self.reasoning and "reasoning" in _MESSAGE_FIELDS else {}
            self.messages.append(
                Message("assistant", "".join(self.text), tool_calls=tuple(self.calls), media=tuple(self.media), **extra)
            )
        self.calls, self.text, self.reasoning, self.media, self.assistant = [], [], [], [], False

    def call(self, call_id: str, name: str, arguments: str) -> None:
        self.assistant = True
        self.names[call_id] = name
        self.calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})

    def add(self, where: str, item: Any) -> None:
        if isinstance(item, MessageItem):
            text, media = item_content(item.content, f"{where}.content", self.reader)
            if item.role == "assistant":
                if self.calls:  # text after a call starts a new turn
                    self.flush()
                self.assistant = True
                self.text.append(text)
                self.media.extend(media)
                return
            self.flush()
            if item.role in ("system", "developer") and not self.messages:
                self.system.append(text)
                self.system_media.extend(media)
            else:
                role = "system" if item.role == "developer" else item.role
                self.messages.append(Message(role, text, media=media))
        elif isinstance(item, FunctionCallItem):
            self.call(item.call_id, _qualified(item.name, item.namespace), item.arguments)
        elif isinstance(item, CustomToolCallItem):
            self.call(
                item.call_id,
                _qualified(item.name, item.namespace),
                json.dumps({"input": item.input}, ensure_ascii=False),
            )
        elif isinstance(item, CallOutputItem):
            self.flush()
            text, media = item_content(item.output, f"{where}.output", self.reader)
            self.messages.append(
                Message("tool", text, tool_call_id=item.call_id, name=self.names.get(item.call_id), media=media)
            )
        elif isinstance(item, ReasoningItem):
            if self.calls or self.text:  # reasoning opens the next assistant turn
                self.flush()
            parts = item.content or item.summary
            self.reasoning.extend(p.text for p in parts)
            if not parts and item.encrypted_content:
                self.reasoning.append(decode_reasoning(item.encrypted_content))

    def finish(self) -> tuple[Message, ...]:
        self.flush()
        head = [Message("system", "\n\n".join(self.system), media=tuple(self.system_media))] if self.system else []
        if not any(m.role != "system" for m in self.messages):
            self.messages.append(Message("user", ""))
        return tuple(head + self.messages)


def conversation(
    items: list[tuple[str, Any]], instructions: str | None, reader: MediaReader | None = None
) -> tuple[Message, ...]:
    """The items as core messages (media read by ``reader``, which keeps the request's count)."""
    builder = _Builder(instructions, reader or MediaReader())
    for where, item in items:
        builder.add(where, item)
    return builder.finish()


# --- reasoning carried by the client ----------------------------------------------------------

_REASONING_TAG = "localrun-reasoning-v1:"


def encode_reasoning(text: str) -> str:
    """``encrypted_content`` for a stateless client (Codex): the reasoning text, readable, not encrypted."""
    import base64

    return _REASONING_TAG + base64.b64encode(text.encode()).decode()


def decode_reasoning(blob: str) -> str:
    """The text of an ``encrypted_content`` localrun wrote; another server's (truly encrypted) blob reads as nothing."""
    import base64
    import binascii

    if not blob.startswith(_REASONING_TAG):
        return ""
    try:
        return base64.b64decode(blob[len(_REASONING_TAG) :], validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return ""
