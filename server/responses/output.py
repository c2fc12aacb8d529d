"""The Responses API's answer: output items, the response object, and the typed event stream.

One set of item builders serves the non-streaming answer and the stream, so the items a
stream's ``response.completed`` carries are the items a non-streamed request returns.
The stream follows OpenAI's order — ``response.created``, ``response.in_progress``, then
per item ``output_item.added`` → (``content_part.added`` → deltas → ``…done``) →
``output_item.done``, and ``response.completed`` (or ``response.incomplete`` when
``max_output_tokens`` ran out) with the whole output and usage. Every event carries
``type`` and a ``sequence_number``; deltas carry ``item_id``, what Codex checks before it
accepts a stream. A text delta is formatted from a prebuilt prefix: one ``json.dumps`` of
its text per token, as on the chat route.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localrun.chat.tool_calls import arguments_object
from localrun.server.errors import stream_error_line
from localrun.server.responses.convert import ToolSet, encode_reasoning
from localrun.server.tool_events import CallEvent
from localrun.types import Usage

_dumps = json.dumps
CALL_TYPES = ("function_call", "custom_tool_call")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def usage_object(u: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": u.total_tokens,
    }


def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(
    item_id: str, text: str | None, *, status: str = "completed", logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """An assistant message; ``text`` None while it is being opened (no content part yet)."""
    content = [] if text is None else [text_part(text, logprobs)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def reasoning_item(item_id: str, text: str | None, *, encrypted: bool, status: str = "completed") -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": item_id, "summary": [], "status": status}
    if text is not None:
        item["content"] = [{"type": "reasoning_text", "text": text}]
        if encrypted:
            item["encrypted_content"] = encode_reasoning(text)
    return item


def call_item(call: dict[str, Any], tools: ToolSet, *, status: str = "completed") -> dict[str, Any]:
    """A parsed call as a ``function_call`` or ``custom_tool_call`` item, named as the client offered it."""
    fn = call.get("function") or {}
    name, arguments = str(fn.get("name", "")), str(fn.get("arguments", ""))
    served = tools.served.get(name)
    call_id = str(call.get("id") or new_id("call"))
    if served is not None and served.kind == "custom":
        args = arguments_object(arguments)
        value = args.get("input") if isinstance(args, dict) else None
        item = {
            "type": "custom_tool_call",
            "id": new_id("ctc"),
            "call_id": call_id,
            "name": served.name,
            "input": value if isinstance(value, str) else arguments,
            "status": status,
        }
    else:
        item = {
            "type": "function_call",
            "id": new_id("fc"),
            "call_id": call_id,
            "name": served.name if served else name,
            "arguments": arguments,
            "status": status,
        }
    if served is not None and served.namespace:
        item["namespace"] = served.namespace
    return item


@dataclass
class Draft:
    """What every response object of one request shares; ``envelope`` fills in the rest."""

    rid: str
    model: str
    echo: dict[str, Any]
    created_at: int = field(default_factory=lambda: int(time.time()))

    def envelope(
        self,
        *,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        incomplete: str | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "model": self.model,
            "output": output,
            "usage": usage,
            **self.echo,
        }


def status_of(finish: str | None) -> tuple[str, str | None]:
    """(status, incomplete reason) from the chunk stream's finish reason."""
    return ("incomplete", "max_output_tokens") if finish == "length" else ("completed", None)


def output_items(
    text: str,
    reasoning: str,
    calls: list[dict[str, Any]],
    tools: ToolSet,
    *,
    encrypted: bool,
    logprobs: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The whole output of a collected answer: reasoning, the message (if any text, or nothing else), calls."""
    items = []
    if reasoning:
        items.append(reasoning_item(new_id("rs"), reasoning, encrypted=encrypted))
    if text or not calls:
        items.append(message_item(new_id("msg"), text, logprobs=logprobs))
    items.extend(call_item(c, tools) for c in calls)
    return items


class EventWriter:
    """Turns chunks into Responses SSE events; keeps the items for ``response.completed``."""

    def __init__(self, draft: Draft, tools: ToolSet, *, encrypted: bool):
        self.draft, self.tools, self.encrypted = draft, tools, encrypted
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self._msg: tuple[str, int] | None = None  # (item id, output index) of the open message
        self._text: list[str] = []
        self._logprobs: list[dict[str, Any]] = []
        self._rs: tuple[str, int] | None = None
        self._rs_text: list[str] = []
        self._delta_head = b""
        self._calls: dict[int, tuple[dict[str, Any], int]] = {}  # call index -> (its item, output index)

    def event(self, kind: str, payload: dict[str, Any]) -> bytes:
        seq = self.seq
        self.seq += 1
        body = _dumps({"type": kind, "sequence_number": seq, **payload}, ensure_ascii=False)
        return f"event: {kind}\ndata: {body}\n\n".encode()

    def start(self) -> bytes:
        snapshot = self.draft.envelope(status="in_progress", output=[])
        return self.event("response.created", {"response": snapshot}) + self.event(
            "response.in_progress", {"response": snapshot}
        )

    # --- deltas ---

    def text(self, delta: str, logprobs: tuple[dict[str, Any], ...] = ()) -> bytes:
        out = self._close_reasoning() if self._rs else b""
        if self._msg is None:
            out += self._open_message()
        self._text.append(delta)
        if logprobs:
            self._logprobs.extend(logprobs)
            assert self._msg is not None  # opened above
            item_id, index = self._msg
            return out + self.event(
                "response.output_text.delta",
                {
                    "item_id": item_id,
                    "output_index": index,
                    "content_index": 0,
                    "delta": delta,
                    "logprobs": list(logprobs),
                },
            )
        seq = self.seq
        self.seq += 1
        return out + self._delta_head + _dumps(delta, ensure_ascii=False).encode() + b',"sequence_number":%d}\n\n' % seq

    def reasoning(self, delta: str) -> bytes:
        out = b""
        if self._rs is None:
            self._rs = (new_id("rs"), len(self.output))
            self.output.append({})  # its place; filled when closed
            out += self.event(
                "response.output_item.added",
                {
                    "output_index": self._rs[1],
                    "item": reasoning_item(self._rs[0], None, encrypted=False, status="in_progress"),
                },
            )
        self._rs_text.append(delta)
        return out + self.event(
            "response.reasoning_text.delta",
            {"item_id": self._rs[0], "output_index": self._rs[1], "content_index": 0, "delta": delta},
        )

    def _open_message(self) -> bytes:
        item_id, index = new_id("msg"), len(self.output)
        self._msg = (item_id, index)
        self.output.append({})
        self._delta_head = (
            'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":'
            + _dumps(item_id)
            + f',"output_index":{index},"content_index":0,"logprobs":[],"delta":'
        ).encode()
        return self.event(
            "response.output_item.added",
            {"output_index": index, "item": message_item(item_id, None, status="in_progress")},
        ) + self.event(
            "response.content_part.added",
            {"item_id": item_id, "output_index": index, "content_index": 0, "part": text_part("")},
        )

    def _close_reasoning(self) -> bytes:
        assert self._rs is not None  # called only while one is open
        item_id, index = self._rs
        text = "".join(self._rs_text)
        item = reasoning_item(item_id, text, encrypted=self.encrypted)
        self.output[index] = item
        self._rs = None
        return self.event(
            "response.reasoning_text.done",
            {"item_id": item_id, "output_index": index, "content_index": 0, "text": text},
        ) + self.event("response.output_item.done", {"output_index": index, "item": item})

    def _close_message(self) -> bytes:
        assert self._msg is not None  # called only while one is open
        item_id, index = self._msg
        text = "".join(self._text)
        part = text_part(text, self._logprobs)
        item = message_item(item_id, text, logprobs=self._logprobs)
        self.output[index] = item
        self._msg = None
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return (
            self.event("response.output_text.done", {**where, "text": text, "logprobs": self._logprobs})
            + self.event("response.content_part.done", {**where, "part": part})
            + self.event("response.output_item.done", {"output_index": index, "item": item})
        )

    # --- the end ---

    def calls(self, events: Sequence[CallEvent]) -> bytes:
        """A ``function_call`` item per call: added (empty arguments) when it starts, its arguments'
        text as ``function_call_arguments.delta`` events, then ``.done`` and the item done when it
        ends. A custom tool's call (its input is a string inside the arguments) goes out whole at its end."""
        out = b""
        for e in events:
            if e.kind == "end" and e.index not in self._calls:
                out += self._close_open() + self._call_events(e.call())
            elif e.kind == "end":
                item, index = self._calls[e.index]
                item.update(arguments=e.text, status="completed")
                where = {"item_id": item["id"], "output_index": index}
                done = {**where, "name": item["name"], "arguments": e.text}
                out += self.event("response.function_call_arguments.done", done)
                out += self.event("response.output_item.done", {"output_index": index, "item": item})
            elif e.kind == "start":
                item, index = call_item(e.call(), self.tools), len(self.output)
                if item["type"] != "function_call":
                    continue
                out += self._close_open()
                self._calls[e.index] = (item, index)
                self.output.append(item)
                opened = {**item, "status": "in_progress"}
                out += self.event("response.output_item.added", {"output_index": index, "item": opened})
            elif e.kind == "arguments" and e.index in self._calls:
                item, index = self._calls[e.index]
                where = {"item_id": item["id"], "output_index": index}
                out += self.event("response.function_call_arguments.delta", {**where, "delta": e.text})
        return out

    def _close_open(self) -> bytes:
        """Close the reasoning or message item that is open, before a call's item."""
        out = self._close_reasoning() if self._rs else b""
        return out + (self._close_message() if self._msg is not None else b"")

    def finish(self, finish: str | None, usage: Usage, *, reasoning_tokens: int = 0) -> tuple[bytes, dict[str, Any]]:
        """The closing events and the final response object (for the store); the calls went out as they came."""
        out = self._close_reasoning() if self._rs else b""
        if self._msg is None and not any(i.get("type") in ("message", *CALL_TYPES) for i in self.output):
            out += self._open_message()
        if self._msg is not None:
            out += self._close_message()
        status, reason = status_of(finish)
        response = self.draft.envelope(
            status=status, output=self.output, usage=usage_object(usage, reasoning_tokens), incomplete=reason
        )
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self.event(kind, {"response": response}), response

    def _call_events(self, call: dict[str, Any]) -> bytes:
        item = call_item(call, self.tools)
        index = len(self.output)
        self.output.append(item)
        opened = {**item, "status": "in_progress"}
        where = {"item_id": item["id"], "output_index": index}
        custom = item["type"] == "custom_tool_call"
        opened["input" if custom else "arguments"] = ""
        out = self.event("response.output_item.added", {"output_index": index, "item": opened})
        if custom:
            out += self.event("response.custom_tool_call_input.delta", {**where, "delta": item["input"]})
            out += self.event("response.custom_tool_call_input.done", {**where, "input": item["input"]})
        else:
            out += self.event("response.function_call_arguments.delta", {**where, "delta": item["arguments"]})
            out += self.event(
                "response.function_call_arguments.done", {**where, "name": item["name"], "arguments": item["arguments"]}
            )
        return out + self.event("response.output_item.done", {"output_index": index, "item": item})

    def fail(self, exc: BaseException) -> tuple[bytes, dict[str, Any]]:
        """``response.failed`` for an error after the stream started; the items so far stay in its output."""
        err = stream_error_line(exc)["error"]
        error = {"code": err.get("code") or "server_error", "message": err["message"]}
        done = [i for i in self.output if i]
        response = self.draft.envelope(status="failed", output=done, error=error)
        return self.event("response.failed", {"response": response}), response
