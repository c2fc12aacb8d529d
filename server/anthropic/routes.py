"""Anthropic Messages routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

One chunk stream, Anthropic's wire format. A streamed answer is the event sequence
Anthropic sends (and Claude Code renders): ``message_start``; per content block
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``thinking_delta`` then
``signature_delta``, ``input_json_delta``) / ``content_block_stop``; ``message_delta``
with the stop reason and usage; ``message_stop``. While a long prompt is being prefilled
(no first chunk after :data:`PING_AFTER_S`), the stream starts and sends ``ping`` every
:data:`PING_EVERY_S`, so clients and proxies do not time out; errors that come before then
are still proper HTTP errors (a prompt over the context is refused before the prefill).

Usage: ``input_tokens`` counts the prompt tokens that were computed, ``cache_read_input_tokens``
those the prefix cache held (Anthropic's split: their sum is the prompt). Runtimes report
usage on the last chunk, which ``message_delta`` carries; ``message_start`` carries the prompt's
size as Anthropic's does (Claude Code tracks its context window from it), counted by the
runtime before the prefill (:func:`~localrun.server.generation.prompt_size`), all of it as ``input_tokens`` since the
cache's share is not known yet.

``stop_sequences`` are matched here, above the runtime, so the answer can say which one
ended it (``stop_reason: "stop_sequence"``); the generation is then stopped, and its usage
is the tokens streamed so far (the runtime's own count never arrives).

A reasoning model's thinking (split by ``localrun.chat.reasoning``) is a ``thinking`` block before the
text, with an empty signature (nothing to sign locally; Claude Code needs the
``signature_delta`` to render it); ``thinking`` and ``output_config.effort`` bound it.

Fields agents send that localrun does not act on are accepted and logged in one place,
:func:`note_ignored`; fields that need a capability go through the same 400 rule as the
OpenAI routes.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localrun.chat import constraints
from localrun.chat.stops import StopMatcher
from localrun.errors import LocalrunError
from localrun.server.anthropic import answers
from localrun.server.anthropic.blocks import PING, BlockWriter, sse, tool_use_block
from localrun.server.anthropic.convert import core_messages, core_tool_choice, core_tools
from localrun.server.anthropic.errors import ANTHROPIC
from localrun.server.anthropic.schemas import CountTokensRequest, MessagesRequest, unknown_fields
from localrun.server.errors import stream_error_line
from localrun.server.fields import parse_body
from localrun.server.generation import Generation, app_state, make_sampling, open_generation, prompt_size
from localrun.server.media_fetch import reader_for, resolve_remote
from localrun.server.openapi import SSE, documented
from localrun.server.reasoning import ReasoningAsk, effort_budget, enable_reasoning
from localrun.server.streams import stream_tail
from localrun.types import ChatRequest, Chunk, Sampling, Usage

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: Seconds without a first chunk before the stream starts with pings; then one ping per period.
PING_AFTER_S = 2.0
PING_EVERY_S = 5.0
#: Declared fields accepted without effect, and why; unknown fields are accepted too. Both are logged.
IGNORED = {
    "metadata": "informational only",
    "service_tier": "there is one local tier",
}


def note_ignored(body: CountTokensRequest) -> None:
    """One log line naming the fields this request sets that localrun accepts without acting on
    (``cache_control`` is not among them: the prefix cache keeps every prefix by itself)."""
    names = [name for name in IGNORED if getattr(body, name, None) is not None] + unknown_fields(body)
    if names:
        log.info("%s: accepted without effect: %s", body.model, ", ".join(sorted(set(names))[:20]))


async def chat_request(
    request: Request, body: CountTokensRequest, sampling: Sampling
) -> tuple[ChatRequest, list[tuple[str, str]]]:
    """The core request and the capabilities it needs (its fields', and its media's: vision, audio)."""
    tools = core_tools(body)
    if body.mcp_servers:
        from localrun.server.errors import InvalidRequest

        raise InvalidRequest(
            "'mcp_servers' asks the server to reach remote MCP servers, which localrun does not do",
            hint="run the MCP tools in the client",
            param="mcp_servers",
        )
    reader = reader_for(request)
    messages = await asyncio.to_thread(core_messages, body, reader)  # media headers: off the event loop
    messages = await resolve_remote(reader, messages, app_state(request).settings.server)
    one_call = body.tool_choice is not None and bool(body.tool_choice.disable_parallel_tool_use)
    req = ChatRequest(
        messages=messages,
        sampling=sampling,
        tools=tools,
        tool_choice=core_tool_choice(body, tools),
        parallel_tool_calls=False if one_call else None,
    )
    return req, body.unsupported() + reader.needs()


def anthropic_usage(u: Usage, *, output: int | None = None) -> dict[str, Any]:
    return {
        "input_tokens": max(0, u.prompt_tokens - u.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens if output is None else output,
    }


def _calls(gen: Generation, body: MessagesRequest) -> list[dict[str, Any]]:
    calls = list(gen.tool_calls)
    if body.tool_choice is not None and body.tool_choice.disable_parallel_tool_use:
        calls = calls[:1]
    return calls


def _stop_reason(finish: str | None, calls: list[dict[str, Any]], matched: str | None) -> str:
    if matched is not None:
        return "stop_sequence"
    if calls:
        return "tool_use"
    return "max_tokens" if finish == "length" else "end_turn"


@documented(MessagesRequest, answers.AnthropicMessage, stream=SSE)
@router.post("/messages")
async def create_message(request: Request) -> Response:
    body: MessagesRequest = await parse_body(request, MessagesRequest)
    note_ignored(body)
    cap = app_state(request).settings.runtime.max_tokens_cap
    sampling = make_sampling(
        cap=cap,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        json_schema=_json_schema(body),
    )
    req, found = await chat_request(request, body, sampling)
    gen = await open_generation(request, body.model, req, keep_alive_s=None, found=found, names=constraints.ANTHROPIC)
    try:
        enable_reasoning(request, gen, req, reasoning_ask(body))
    except LocalrunError:
        await gen.aclose()
        raise
    answer = Answer(gen, body)
    if not body.stream:
        return await answer.whole()
    try:
        answer.prompt_tokens = await prompt_size(request, gen.record.name, req)
    except BaseException:  # the client left while it was counted: the admitted slot is given back
        await gen.aclose()
        raise
    return await answer.stream()


def reasoning_ask(body: MessagesRequest) -> ReasoningAsk:
    """The reasoning budget: ``thinking`` (disabled: none; enabled: its budget_tokens) and
    ``output_config.effort`` (a word, see localrun.server.reasoning.EFFORT_TOKENS); the smaller wins.
    ``adaptive`` leaves it to the model, bounded by max_tokens."""
    asks: list[tuple[int, str]] = []
    thinking = body.thinking
    if thinking is not None and thinking.type == "disabled":
        asks.append((0, "thinking"))
    elif thinking is not None and thinking.type == "enabled" and thinking.budget_tokens is not None:
        asks.append((thinking.budget_tokens, "thinking.budget_tokens"))
    effort = body.output_config.effort if body.output_config else None
    if effort is not None and (tokens := effort_budget(effort)) is not None:
        asks.append((tokens, "output_config.effort"))
    if not asks:
        return ReasoningAsk()
    budget, field = min(asks)
    return ReasoningAsk(budget, field)


def _json_schema(body: CountTokensRequest) -> dict[str, Any] | None:
    fmt = body.output_config.format if body.output_config else None
    return None if fmt is None else (fmt.schema_ or {})


@documented(CountTokensRequest, answers.TokenCount)
@router.post("/messages/count_tokens", response_model=None)
async def count_tokens(request: Request) -> dict[str, Any]:
    """The prompt's length, by running the request with no tokens to generate: the count is the
    rendering and tokenization the request itself would get, on every runtime, and the prefill
    leaves the prompt in the prefix cache for the request that usually follows."""
    body: CountTokensRequest = await parse_body(request, CountTokensRequest)
    note_ignored(body)
    req, found = await chat_request(request, body, Sampling(max_tokens=0))
    gen = await open_generation(request, body.model, req, keep_alive_s=None, found=found, names=constraints.ANTHROPIC)
    await gen.collect()
    return {"input_tokens": gen.usage.prompt_tokens}


class Answer:
    """One message being answered: the stop-sequence watch, the blocks, the two wire forms."""

    def __init__(self, gen: Generation, body: MessagesRequest):
        self.gen, self.body = gen, body
        self.ident = "msg_" + secrets.token_hex(12)
        self.stops = StopMatcher(body.stop_sequences or ())
        self.matched: str | None = None
        self.pieces = 0  # text chunks seen: the usage when a stop sequence ends the generation early
        self.seen, self.sent = "", 0  # all text the model made, and how much of it went out
        self.prompt_tokens = 0  # for message_start, before the runtime's usage arrives (generation.prompt_size)

    def _text(self, chunk: Chunk) -> str:
        """The chunk's text up to a stop sequence; after one, nothing."""
        if self.matched is not None:
            return ""
        self.pieces += bool(chunk.text)
        if not self.body.stop_sequences:
            return chunk.text
        self.seen += chunk.text
        text, hit = self.stops.push(chunk.text)
        self.sent += len(text)
        if hit:  # the text sent ends right before the stop that matched first
            self.matched = next(
                (s for s in self.body.stop_sequences if self.seen.startswith(s, self.sent)), self.body.stop_sequences[0]
            )
        elif chunk.finish_reason:
            rest, hit = self.stops.finish()
            text += rest
            self.sent += len(rest)
            if hit:  # held whole behind a longer stop's prefix until the end
                self.matched = next(
                    (s for s in self.body.stop_sequences if self.seen.startswith(s, self.sent)),
                    self.body.stop_sequences[0],
                )
        return text

    def usage(self) -> dict[str, Any]:
        if self.matched is not None:
            return anthropic_usage(self.gen.usage, output=max(self.pieces, self.gen.usage.completion_tokens))
        return anthropic_usage(self.gen.usage)

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.ident,
            "type": "message",
            "role": "assistant",
            "model": self.gen.record.name,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": self.matched,
            "usage": usage,
        }

    async def whole(self) -> Response:
        thought: list[str] = []

        async def fold() -> list[str]:
            parts: list[str] = []
            chunks = self._chunks(None)
            try:
                async for chunk in chunks:
                    thought.append(chunk.reasoning)
                    parts.append(self._text(chunk))
                    if self.matched is not None:
                        break
            finally:
                await chunks.aclose()  # a stop sequence ends the generation in the worker too
            return parts

        try:
            parts = await self.gen.guarded(fold())
        finally:
            await self.gen.aclose()
        calls = _calls(self.gen, self.body) if self.matched is None else []
        text = "".join(parts)
        thinking = "".join(thought)
        content = [{"type": "thinking", "thinking": thinking, "signature": ""}] if thinking else []
        content += ([{"type": "text", "text": text}] if text or not (calls or thinking) else []) + [
            tool_use_block(c) for c in calls
        ]
        reason = _stop_reason(self.gen.finish_reason, calls, self.matched)
        return JSONResponse(self._message(content, reason, self.usage()))

    async def _chunks(self, first: Chunk | None) -> AsyncGenerator[Chunk, None]:
        if first is not None:
            yield first
        rest = self.gen.rest()
        try:
            async for chunk in rest:
                yield chunk
        finally:
            await rest.aclose()

    async def stream(self) -> Response:
        waiting = asyncio.ensure_future(self.gen.first())
        done, _ = await asyncio.wait({waiting}, timeout=PING_AFTER_S)
        if done:
            first = waiting.result()  # an error raised before any byte is sent is a proper HTTP error
            return StreamingResponse(self._events(first, None), media_type="text/event-stream", headers=SSE_HEADERS)
        return StreamingResponse(self._events(None, waiting), media_type="text/event-stream", headers=SSE_HEADERS)

    async def _events(self, first: Chunk | None, waiting: asyncio.Future[Chunk | None] | None) -> AsyncIterator[bytes]:
        blocks = BlockWriter()
        start = anthropic_usage(Usage(prompt_tokens=self.prompt_tokens))
        yield sse("message_start", {"type": "message_start", "message": self._message([], None, start)})
        if waiting is not None:
            try:
                yield PING
                while not (await asyncio.wait({waiting}, timeout=PING_EVERY_S))[0]:
                    yield PING
                first = waiting.result()
            except LocalrunError as exc:  # started already: the error travels in the stream
                log.warning("stream of %s ended with an error: %s", self.gen.record.name, exc)
                yield _error_event(exc)
                return
            finally:
                if not waiting.done():
                    waiting.cancel()  # the client left during the prefill: first() stops the worker

        one = self.body.tool_choice is not None and bool(self.body.tool_choice.disable_parallel_tool_use)
        calls = self.gen.call_events(limit=1 if one else None)

        def lines(chunk: Chunk) -> list[bytes]:
            out = blocks.thinking(chunk.reasoning) + blocks.text(self._text(chunk))
            return out + blocks.calls(calls.push(chunk)) if self.matched is None else out

        async def finish() -> AsyncIterator[bytes]:
            calls = _calls(self.gen, self.body) if self.matched is None else []
            for line in blocks.finish():
                yield line
            reason = _stop_reason(self.gen.finish_reason, calls, self.matched)
            delta = {"stop_reason": reason, "stop_sequence": self.matched}
            yield sse("message_delta", {"type": "message_delta", "delta": delta, "usage": self.usage()})
            yield sse("message_stop", {"type": "message_stop"})

        def stopped() -> bool:  # a stop sequence ends the stream
            return self.matched is not None

        opening = [first] if first is not None else []
        async for out in stream_tail(self.gen, opening, lines, failed=_error_event, finish=finish, until=stopped):
            yield out


def _error_event(exc: LocalrunError) -> bytes:
    """The ``error`` event of a stream that started, in Anthropic's shape."""
    return sse("error", stream_error_line(exc, ANTHROPIC))
