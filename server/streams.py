"""The tail of every streamed answer, written once: the chunks, then the family's closing lines.

Each family turns a chunk into its own lines (SSE events, NDJSON objects); what is the same
everywhere lives here. The first chunk was awaited before the response started, so an error
before it was a proper HTTP error; from here on the status line is sent, and an error that
comes with a later chunk travels in the stream as the family's error line, which ends it.
A family that stops early (Anthropic's stop sequences) says so with ``until``; the rest of
the generation is closed either way, which stops the worker's request too.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable

from localrun.errors import LocalrunError
from localrun.server.generation import Generation
from localrun.types import Chunk

log = logging.getLogger(__name__)


def _never() -> bool:
    return False


async def _chunks(opening: Iterable[Chunk], rest: AsyncIterator[Chunk]) -> AsyncGenerator[Chunk, None]:
    for chunk in opening:
        yield chunk
    async for chunk in rest:
        yield chunk


async def stream_tail(
    gen: Generation,
    opening: Iterable[Chunk],
    lines: Callable[[Chunk], Iterable[bytes | None]],
    *,
    failed: Callable[[LocalrunError], bytes],
    finish: Callable[[], AsyncIterator[bytes]],
    until: Callable[[], bool] = _never,
) -> AsyncIterator[bytes]:
    """``opening`` (the first chunk, awaited already, and whatever a family sends before it)
    then the rest of ``gen``, each chunk as ``lines(chunk)`` (an empty line or None is not sent); then
    ``finish()``'s lines, or ``failed(exc)`` alone when the generation fails."""
    rest = gen.rest()
    source = _chunks(opening, rest)
    try:
        async for chunk in source:
            for out in lines(chunk):
                if out:
                    yield out
            if until():
                break
    except LocalrunError as exc:  # started already: the error travels in the stream
        log.warning("stream of %s ended with an error: %s", gen.record.name, exc)
        yield failed(exc)
        return
    finally:
        await source.aclose()
        await rest.aclose()
    async for out in finish():
        yield out
