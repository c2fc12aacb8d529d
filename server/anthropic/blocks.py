"""The content blocks of a streamed Anthropic message, and the events that carry them.

A block opens when its first piece comes and closes before the next kind: ``thinking`` (with the
``signature_delta`` Claude Code waits for), ``text``, and one ``tool_use`` block per call, opened
with an empty ``input`` as soon as the call's name is known, its arguments following as
``input_json_delta`` pieces of the raw JSON text (:mod:`localrun.server.tool_events`), closed
when the call ends, as Anthropic streams them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from localrun.chat.tool_calls import arguments_object
from localrun.server.tool_events import CallEvent

__all__ = ["PING", "BlockWriter", "sse", "tool_id", "tool_use_block"]


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    args = arguments_object(fn.get("arguments") or "{}")
    return {
        "type": "tool_use",
        "id": tool_id(call["id"]),
        "name": fn["name"],
        "input": args if isinstance(args, dict) else {},
    }


def tool_id(call_id: str) -> str:
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


PING = sse("ping", {"type": "ping"})


class BlockWriter:
    """Content blocks in order, each opened when its first piece comes and closed before the next kind."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None
        self._text_head = b""

    def _start(self, kind: str, block: dict[str, Any]) -> bytes:
        self.index += 1
        self.open = kind
        return sse("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})

    def _stop(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # Claude Code renders thinking only once a signature came
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        self.open = None
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def text(self, text: str) -> list[bytes]:
        if not text:
            return []
        out = []
        if self.open != "text":
            out += self._stop()
            out.append(self._start("text", {"type": "text", "text": ""}))
            # The per-token event from a prebuilt prefix: one json.dumps of the text, as the OpenAI route does.
            self._text_head = (
                f'event: content_block_delta\ndata: {{"type": "content_block_delta", "index": {self.index:d}, '
                '"delta": {"type": "text_delta", "text": '
            ).encode()
        out.append(self._text_head + json.dumps(text, ensure_ascii=False).encode() + b"}}\n\n")
        return out

    def thinking(self, text: str) -> list[bytes]:
        if not text:
            return []
        out = []
        if self.open != "thinking":
            out += self._stop()
            out.append(self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""}))
        out.append(self._delta({"type": "thinking_delta", "thinking": text}))
        return out

    def calls(self, events: Sequence[CallEvent]) -> list[bytes]:
        """Each call a ``tool_use`` block: opened with an empty input when it starts, its arguments'
        text as ``input_json_delta`` pieces while they come, closed when it ends."""
        out: list[bytes] = []
        for e in events:
            if e.kind == "start":
                out += self._stop()
                block = {"type": "tool_use", "id": tool_id(e.id), "name": e.name, "input": {}}
                out.append(self._start("tool_use", block))
            elif e.kind == "arguments" and e.text:
                out.append(self._delta({"type": "input_json_delta", "partial_json": e.text}))
            elif e.kind == "end":
                out += self._stop()
        return out

    def finish(self) -> list[bytes]:
        """Close the open block (an empty answer is still one, empty, text block)."""
        out = []
        if self.index < 0:
            out.append(self._start("text", {"type": "text", "text": ""}))
        return out + self._stop()
