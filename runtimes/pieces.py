"""What a backend that does not decode tokens itself produces, and the one way it becomes chunks.

:func:`shape_stream` turns a backend's text pieces into the core's
:class:`~localrun.types.Chunk` stream with one behaviour for every runtime: stop strings cut
the text (a tail that could begin a stop string is held back until it cannot), a cancel ends
the stream with ``finish_reason="cancelled"`` at the next piece, and the last chunk carries
the finish reason and the usage. MLX feeds it tokens; MLC, vLLM, Ollama and the upstreams
feed it what their servers send. It lives below every HTTP dialect so that a runtime that
speaks no HTTP (MLX) need not import one.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from localrun.chat.stops import StopMatcher
from localrun.types import Cancel, Chunk, Usage


@dataclass(frozen=True)
class Piece:
    """What a backend produced in one step: text, and on its last step why it ended."""

    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" from the backend, on its last piece
    usage: Usage | None = None  # the backend's own count, when it reports one
    tokens: int = 1  # tokens this piece stands for, when the backend reports no usage
    #: Log-probability entries of the tokens behind this piece (``Chunk.logprobs`` shape).
    logprobs: tuple[dict[str, Any], ...] = ()
    #: Tool calls the backend parsed itself (OpenAI shape), gathered onto the last chunk.
    tool_calls: tuple[dict[str, Any], ...] = ()


def shape_stream(
    pieces: Iterator[Piece], *, stops: Sequence[str], cancel: Cancel, prompt_tokens: int = 0
) -> Generator[Chunk, None, None]:
    """Turn backend pieces into chunks: stop strings, cancel and a final chunk with usage.

    A piece's logprob entries ride the next chunk sent, so a token whose text is held back
    (a stop string may be starting) loses none; what is left rides the last chunk, with
    the tool calls, whose finish reason becomes "tool_calls" when the answer made any.
    The source iterator is closed on the way out (early stop, cancel, error), which for
    the HTTP runtimes closes the response and so stops the server's generation.
    """
    scanner = StopMatcher(stops)
    generated = 0
    usage: Usage | None = None
    finish = "stop"
    pending: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []

    def chunk(text: str) -> Chunk:
        lp = tuple(pending)
        pending.clear()
        return Chunk(text, logprobs=lp)

    try:
        for piece in pieces:
            if cancel.is_set():
                finish = "cancelled"
                break
            generated += piece.tokens
            usage = piece.usage or usage
            pending.extend(piece.logprobs)
            calls.extend(piece.tool_calls)
            text, hit = scanner.push(piece.text)
            ended = hit or piece.finish_reason is not None
            if ended:
                # A stop string ends the answer where it starts; the backend's own end flushes what was held.
                finish = "stop" if hit else str(piece.finish_reason)  # not None: `ended` without a hit
                if not hit:
                    rest, held_stop = scanner.finish()  # a stop held whole behind a longer one's prefix
                    text += rest
                    finish = "stop" if held_stop else finish
            if text:
                yield chunk(text)
            if ended:
                break
        else:
            # The source ended without a finish reason: a cancel that closed it, or a
            # backend that just stops sending.
            finish = "cancelled" if cancel.is_set() else "stop"
            rest = "" if finish == "cancelled" else scanner.flush()
            if rest:
                yield chunk(rest)
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()
    if usage is None or (finish == "cancelled" and usage.completion_tokens < generated):
        usage = Usage(prompt_tokens=usage.prompt_tokens if usage else prompt_tokens, completion_tokens=generated)
    if calls and finish in ("stop", "length"):
        finish = "tool_calls"
    last = chunk("")
    yield Chunk("", finish_reason=finish, usage=usage, tool_calls=tuple(calls), logprobs=last.logprobs)
