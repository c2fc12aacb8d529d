"""The SSE events of a streamed OpenAI answer with one choice, and the call and finish fields
every OpenAI answer with tools shares (the legacy ``functions`` shape included).

Each event is formatted from a prebuilt prefix, so a plain text token costs one ``json.dumps``
of its text and one socket write; chunks with log-probabilities, tool calls or reasoning are
built as whole objects (they are rarer, and larger anyway). The tail (first chunk, rest, error
line) is :func:`localrun.server.streams.stream_tail`.

Tool calls stream as OpenAI streams them (:mod:`localrun.server.tool_events`): a call's first
``delta.tool_calls`` entry has its index, id, type and name (with ``arguments`` empty or the
first piece), the later ones its index and the next piece of the arguments; a ``functions``
request gets ``delta.function_call`` the same way (the name first, then the arguments).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from localrun.server.generation import Generation, finish_for_wire
from localrun.server.openai.choices import AnswerHead, chat_logprobs, legacy_logprobs, sse_error, usage_dict
from localrun.server.reasoning import reasoning_fields
from localrun.server.streams import stream_tail
from localrun.server.tool_events import CallEvent
from localrun.settings import Settings
from localrun.types import Chunk

log = logging.getLogger(__name__)


def tool_calls(gen: Generation, body: Any) -> list[dict[str, Any]]:
    calls = list(gen.tool_calls)
    if getattr(body, "parallel_tool_calls", None) is False:
        calls = calls[:1]
    return calls


def is_legacy(body: Any, chat: bool) -> bool:
    """Whether the answer takes the legacy shape: the request offered ``functions``, not ``tools``."""
    return chat and bool(getattr(body, "functions", None))


def function_call(gen: Generation) -> dict[str, Any] | None:
    """The legacy ``function_call`` of the answer: its first call, the only one that shape can carry."""
    if not gen.tool_calls:
        return None
    if len(gen.tool_calls) > 1:
        log.info(
            "%s made %d calls but a 'functions' request's answer carries one: kept %r, dropped %s",
            gen.record.name,
            len(gen.tool_calls),
            gen.tool_calls[0]["function"]["name"],
            [c["function"]["name"] for c in gen.tool_calls[1:]],
        )
    fn = gen.tool_calls[0]["function"]
    return {"name": fn["name"], "arguments": fn["arguments"]}


def finish_of(gen: Generation, legacy: bool) -> str:
    finish = finish_for_wire(gen.finish_reason)
    return "function_call" if legacy and finish == "tool_calls" else finish


def call_deltas(events: Sequence[CallEvent]) -> list[dict[str, Any]]:
    """OpenAI's ``delta.tool_calls`` for a chunk's call events: a call's first entry has its id, type
    and name with the arguments so far; later ones its index and the next piece of the arguments."""
    out: list[dict[str, Any]] = []
    for e in events:
        if e.kind == "start":
            fn = {"name": e.name, "arguments": ""}
            out.append({"index": e.index, "id": e.id, "type": "function", "function": fn})
        elif e.kind == "arguments" and out and out[-1]["index"] == e.index:
            out[-1]["function"]["arguments"] += e.text
        elif e.kind == "arguments":
            out.append({"index": e.index, "function": {"arguments": e.text}})
    return out


class ChoiceEvents:
    """The lines of one streamed choice: the prefixes built once, each chunk one event."""

    def __init__(
        self,
        gen: Generation,
        body: Any,
        *,
        base: dict[str, Any],
        chat: bool,
        echo: str | None,
        settings: Settings | None,
    ) -> None:
        self.gen, self.body, self.base, self.chat, self.settings = gen, body, base, chat, settings
        self.head = "data: " + json.dumps(base)[:-1]
        if chat:
            self.opening = (self.head + ',"choices":[{"index":0,"delta":{"role":"assistant","content":').encode()
            self.before = (self.head + ',"choices":[{"index":0,"delta":{"content":').encode()
            self.after = b'},"logprobs":null,"finish_reason":null}]}\n\n'
            self.closing = self.head + ',"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":'
        else:
            self.before = self.opening = (self.head + ',"choices":[{"index":0,"text":').encode()
            self.after = b',"logprobs":null,"finish_reason":null}]}\n\n'
            self.closing = self.head + ',"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":'
        self.legacy = is_legacy(body, chat)
        # the logprobs' text_offset
        self.offset = 0 if chat else len(echo) if echo is not None else len(body.prompt_text())
        self.role = True  # the first event says the role
        one = self.legacy or getattr(body, "parallel_tool_calls", None) is False
        self.calls = gen.call_events(limit=1 if one else None) if chat else None

    def lines(self, chunk: Chunk) -> tuple[bytes, ...]:
        role, self.role = self.role, False
        calls = call_deltas(self.calls.push(chunk)) if self.calls is not None else []
        if chunk.logprobs or calls or chunk.reasoning:
            return (self.full(chunk, role=role, calls=calls),)
        if not chunk.text and not role:
            return ()
        if not self.chat:
            self.offset += len(chunk.text)
        return (
            (self.opening if role else self.before) + json.dumps(chunk.text, ensure_ascii=False).encode() + self.after,
        )

    def full(self, chunk: Chunk, *, role: bool, calls: Sequence[dict[str, Any]] = ()) -> bytes:
        """One event for a chunk that carries more than text (``calls``: its ``delta.tool_calls``)."""
        choice: dict[str, Any]
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            delta.update(reasoning_fields(chunk.reasoning, self.settings))
            if chunk.text or not (calls or chunk.reasoning):
                delta["content"] = chunk.text
            if calls and self.legacy:  # the name first, then the arguments piece by piece
                delta["function_call"] = dict(calls[0]["function"])
            elif calls:
                delta["tool_calls"] = list(calls)
            choice = {"index": 0, "delta": delta, "logprobs": chat_logprobs(chunk.logprobs) if chunk.logprobs else None}
        else:
            lp = legacy_logprobs(chunk.logprobs, self.offset)
            self.offset += len(chunk.text)
            choice = {"index": 0, "text": chunk.text, "logprobs": lp}
        choice["finish_reason"] = None
        return b"data: " + json.dumps({**self.base, "choices": [choice]}, ensure_ascii=False).encode() + b"\n\n"


async def sse_events(
    gen: Generation,
    first: Chunk | None,
    body: Any,
    head: AnswerHead,
    *,
    echo: str | None = None,
    settings: Settings | None = None,
) -> AsyncIterator[bytes]:
    """The stream of a one-choice answer: the role with the first event, a closing event with the
    finish reason, the usage when asked, then ``[DONE]``."""
    chat, include_usage = head.chat, head.include_usage
    base = head.base(gen)
    events = ChoiceEvents(gen, body, base=base, chat=chat, echo=echo, settings=settings)

    async def finish() -> AsyncIterator[bytes]:
        yield (events.closing + json.dumps(finish_of(gen, events.legacy)) + "}]}\n\n").encode()
        if include_usage:
            yield (events.head + ',"choices":[],"usage":' + json.dumps(usage_dict(gen.usage)) + "}\n\n").encode()
        yield b"data: [DONE]\n\n"

    opening = [*([Chunk(text=echo)] if echo else []), first if first is not None else Chunk()]
    async for out in stream_tail(gen, opening, events.lines, failed=sse_error, finish=finish):
        yield out
