"""The pieces of a streamed answer: :class:`Chunk`, its :class:`Usage`, and the tool-call deltas it carries.

Split from :mod:`localrun.types` (which re-exports every name here) so the chunk's parts stay
together. Frozen dataclasses; the worker pipe carries them as dicts (``to_dict`` / ``from_dict``).
Nothing here imports a runtime or a UI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallDelta:
    """One step of a tool call being written (:mod:`localrun.chat.tool_stream`), in the order the model wrote it.

    A call's first delta has its ``id`` and ``name`` (the call starts); each delta may add the next
    piece of the arguments' JSON text, every accumulated prefix a prefix of valid JSON; the last one
    says ``end``. The pieces of one call concatenate to the final ``arguments`` string of
    ``Chunk.tool_calls`` exactly. The final chunk's ``tool_calls`` stay the answer's truth: a call
    a runtime never streamed is only there (every API's stream then sends it whole).
    """

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    end: bool = False

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"index": self.index}
        for key in ("id", "name", "arguments"):
            if getattr(self, key):
                d[key] = getattr(self, key)
        if self.end:
            d["end"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CallDelta:
        return cls(
            index=int(d["index"]),
            id=str(d.get("id", "")),
            name=str(d.get("name", "")),
            arguments=str(d.get("arguments", "")),
            end=bool(d.get("end", False)),
        )


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    #: Speculative decoding: tokens drafted and verified, and how many of them the model kept
    #: (each kept one is a decode pass saved). 0 when the runtime did not draft.
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def logprob_entry(token: bytes | str, logprob: float) -> dict[str, Any]:
    """One entry of ``Chunk.logprobs``: the token's text (bytes decoded, invalid UTF-8 replaced),
    its log-probability and its raw bytes (a token may be part of a character)."""
    raw = token if isinstance(token, bytes) else token.encode()
    text = token if isinstance(token, str) else raw.decode("utf-8", errors="replace")
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


@dataclass(frozen=True)
class Chunk:
    """One piece of a streamed answer. The last chunk has ``finish_reason`` and ``usage``."""

    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "tool_calls"
    usage: Usage | None = None
    #: Parsed tool calls, on the final chunk: ``({"id", "type": "function", "function": {"name", "arguments"}}, …)``.
    tool_calls: tuple[dict[str, Any], ...] = ()
    #: Per token of ``text``: ``({"token", "logprob", "bytes", "top_logprobs": [...]}, …)`` when asked for.
    logprobs: tuple[dict[str, Any], ...] = ()
    #: Which choice this chunk belongs to (``Sampling.n`` > 1); every choice ends with its own final chunk.
    index: int = 0
    #: Reasoning-channel text, split from ``text`` by each front end (:mod:`localrun.chat.reasoning`);
    #: runtimes leave it empty.
    reasoning: str = ""
    #: Tool calls as they are written (:class:`CallDelta`), before the final chunk carries them whole.
    call_deltas: tuple[CallDelta, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"text": self.text}
        if self.index:
            d["index"] = self.index
        if self.finish_reason is not None:
            d["finish_reason"] = self.finish_reason
        if self.usage is not None:
            d["usage"] = dataclasses.asdict(self.usage)
        if self.tool_calls:
            d["tool_calls"] = list(self.tool_calls)
        if self.logprobs:
            d["logprobs"] = list(self.logprobs)
        if self.reasoning:
            d["reasoning"] = self.reasoning
        if self.call_deltas:
            d["call_deltas"] = [c.to_dict() for c in self.call_deltas]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Chunk:
        u = d.get("usage")
        return cls(
            text=d.get("text", ""),
            finish_reason=d.get("finish_reason"),
            usage=Usage(**u) if u else None,
            tool_calls=tuple(d.get("tool_calls") or ()),
            logprobs=tuple(d.get("logprobs") or ()),
            index=int(d.get("index", 0)),
            reasoning=d.get("reasoning", ""),
            call_deltas=tuple(CallDelta.from_dict(c) for c in d.get("call_deltas") or ()),
        )


def fold(chunks: Iterable[Chunk]) -> tuple[str, str | None, Usage]:
    """Join a chunk stream into (text, finish_reason, usage): the non-streaming answer."""
    parts: list[str] = []
    finish, usage = None, Usage()
    for c in chunks:
        parts.append(c.text)
        if c.finish_reason:
            finish = c.finish_reason
        if c.usage:
            usage = c.usage
    return "".join(parts), finish, usage
