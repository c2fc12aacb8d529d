"""What the server is doing, in words a person waiting on an agent can read, and overflow errors that
name their fix.

``localrun.activity`` is the logger of one line per request (model, prompt tokens, how long the
prefill took, tokens per second, why a request was refused); ``launch`` writes it to a log file
whose path it prints, since the agent's full-screen interface owns the terminal. The llama.cpp
worker adds prefill progress of long prompts to the same file (runtimes/llamacpp/scheduler.py).

:func:`with_context_hint` gives every "prompt is too long" the option that fixes it: the runtime
that raises it knows the numbers but not how the model was configured; the manager knows both.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from localrun.errors import ContextOverflow, LocalrunError
from localrun.planning.context import grown_context
from localrun.planning.placement import ModelShape
from localrun.types import Chunk

log = logging.getLogger("localrun.activity")

_TOKENS = re.compile(r"(\d+) tokens")
#: Room left for the answer when the fix names a context: a prompt that only just fits answers nothing.
ANSWER_ROOM = 1024


def context_fix(name: str, trained: int | None, prompt_tokens: int | None) -> str:
    """The words that tell a user how to give ``name`` a context for ``prompt_tokens``."""
    if prompt_tokens and trained and prompt_tokens >= trained:
        return (
            f"{name} was trained on {trained:,} tokens: shorten the conversation or pick a model with a longer context"
        )
    need = grown_context(prompt_tokens + ANSWER_ROOM, trained) if prompt_tokens else None
    n = f" {need}" if need else " N"
    return (
        f'start the server with --ctx{n} or set [models."{name}"] ctx ={n} in config.toml '
        f"(runtime.ctx for every model), or shorten the conversation"
    )


def with_context_hint(exc: ContextOverflow, record: Any, runtime: str = "") -> ContextOverflow:
    """``exc`` with a hint that names the option which fixes it (set in place; returned for ``raise``).
    An upstream's context is that server's to set: its own words stay."""
    if runtime == "upstream":
        return exc
    found = _TOKENS.search(exc.message)
    trained = ModelShape.from_metadata(record.metadata).n_ctx_train
    exc.hint = context_fix(record.name, trained, int(found.group(1)) if found else None)
    return exc


class Watch:
    """Timings of one request's stream, logged when it ends (or why it was refused)."""

    def __init__(self, lm: Any, req: Any) -> None:
        self.lm, self.kind = lm, type(req).__name__.replace("Request", "").lower()
        tools = len(getattr(req, "tools", None) or ())
        if tools:  # an agent's request carries its whole tool list: the count shows it arrived
            self.kind += f" with {tools} tools"
        self.t0 = time.perf_counter()
        self.first: float | None = None
        self.pieces = 0
        self.usage = None
        self.finish: str | None = None

    def note(self, chunk: Chunk) -> None:
        if chunk.text or chunk.reasoning:
            self.first = self.first or time.perf_counter()
            self.pieces += 1
        if chunk.usage:
            self.usage = chunk.usage
        if chunk.finish_reason:
            self.finish = chunk.finish_reason

    def refused(self, exc: LocalrunError) -> None:
        """Log why the request was refused; an overflow gets the hint that names its fix first (in place)."""
        if isinstance(exc, ContextOverflow):
            with_context_hint(exc, self.lm.record, self.lm.plan.runtime)
        hint = f" ({exc.hint})" if exc.hint else ""
        log.warning("%s: %s refused: %s%s", self.lm.name, self.kind, exc.message, hint)

    def done(self) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        end = time.perf_counter()
        first = self.first or end
        prompt = self.usage.prompt_tokens if self.usage else 0
        n = self.usage.completion_tokens if self.usage else self.pieces
        prefill_s, decode_s = first - self.t0, end - first
        prefill_rate = f", {prompt / prefill_s:.0f} tok/s" if prompt and prefill_s > 0 else ""
        rate = (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0
        log.info(
            "%s: %s of %d prompt tokens (context %d): first token after %.1f s%s; %d tokens at %.1f tok/s; %s",
            self.lm.name,
            self.kind,
            prompt,
            self.lm.plan.n_ctx,
            prefill_s,
            prefill_rate,
            n,
            rate,
            self.finish or "stopped",
        )


def watched(lm: Any, req: Any, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """``chunks`` with a line in the activity log at the end, and overflow errors naming their fix."""
    watch = Watch(lm, req)
    try:
        for chunk in chunks:
            watch.note(chunk)
            yield chunk
    except LocalrunError as exc:
        watch.refused(exc)
        raise
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:  # a reader that left early cancels the request now, not at garbage collection
            close()
    watch.done()


async def awatched(lm: Any, req: Any, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """The asynchronous twin of :func:`watched`."""
    watch = Watch(lm, req)
    try:
        async for chunk in chunks:
            watch.note(chunk)
            yield chunk
    except LocalrunError as exc:
        watch.refused(exc)
        raise
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:  # a reader that left early cancels the request now, not at garbage collection
            await aclose()
    watch.done()
