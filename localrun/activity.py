"""What the server is doing, in words a person waiting on an agent can read, and overflow errors that
name their fix.

``localrun.activity`` is the logger of one line per request (model, prompt tokens, how long the
prefill took, tokens per second, why a request was refused); ``launch`` writes it to a log file
whose path it prints, since the agent's full-screen interface owns the terminal. The llama.cpp
worker adds prefill progress of long prompts to the same file (runtimes/llamacpp/scheduler.py).

:class:`RequestTiming` is the one measure of a request's tokens (time to first, rate, gaps) that
the log line, the server's stats and the TUI all read: the manager starts one per stream.

:func:`with_context_hint` gives every "prompt is too long" the option that fixes it: the runtime
that raises it knows the numbers but not how the model was configured; the manager knows both.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from localrun.errors import ContextOverflow, LocalrunError
from localrun.planning.context import grown_context
from localrun.planning.placement import ModelShape
from localrun.residency import LoadedModel, Residency
from localrun.types import (
    META_PROJECTOR,
    Cancel,
    ChatRequest,
    Chunk,
    CompletionRequest,
    Format,
    Media,
    ModelRecord,
    Plan,
    Usage,
)

if TYPE_CHECKING:
    from localrun.settings import RuntimeSettings

Request = ChatRequest | CompletionRequest
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
    from localrun.planning.policies import policy_for

    if not policy_for(runtime).hints_context:
        return exc
    found = _TOKENS.search(exc.message)
    trained = ModelShape.from_metadata(record.metadata).n_ctx_train
    exc.hint = context_fix(record.name, trained, int(found.group(1)) if found else None)
    return exc


#: ``(record, plan, media the runtime takes) -> None``, raising the refusal: see ``ModelManager.aopen``.
MediaCheck = Callable[[ModelRecord, Plan, frozenset[str]], None]


def refuse_media_before_load(
    record: ModelRecord, plan: Plan, media: tuple[Media, ...], check: MediaCheck | None
) -> None:
    """Refuse media before a load (most of a minute for a large model) when the runtime knows
    without loading that the model cannot take them: a GGUF without a projector. ``check`` (the
    server's: its words name the request's field) refuses, else the CLI's and the TUI's words do.

    Raises:
        UnsupportedFeature: the model cannot take the media.
    """
    from localrun.runtimes import get_runtime

    known = getattr(get_runtime(plan.runtime), "media_before_load", None)
    takes = known(record, plan) if known is not None else None
    if takes is None:  # only the loaded session can say
        return
    if check is not None:
        check(record, plan, takes)
        return
    from localrun.chat.attach import require_media_support

    has_projector = bool(record.metadata.get(META_PROJECTOR))
    require_media_support(media, takes, model=record.name, has_projector=has_projector)


def completion_mode(record: ModelRecord, plan: Plan) -> bool:
    """A model that only completes text: a GGUF without a chat template (its own or one given)."""
    from localrun.chat.reasoning import template_of

    return record.format is Format.GGUF and not template_of(record, plan)


def answer_limit(req: Request, record: ModelRecord, plan: Plan, runtime: RuntimeSettings) -> Request:
    """``req`` with its answer bounded, for every front end (each API, ``run``, the TUI): a limit it
    asked for within ``max_tokens_cap``; none asked, ``completion_max_tokens`` for a model in
    completion mode (a base model never ends by itself) and the cap otherwise."""
    asked = req.sampling.max_tokens
    if asked is not None:
        limit = min(asked, runtime.max_tokens_cap)
    elif completion_mode(record, plan):
        limit = min(runtime.completion_max_tokens, runtime.max_tokens_cap)
    else:
        limit = runtime.max_tokens_cap
    if limit == asked:
        return req
    return dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, max_tokens=limit))


class RequestTiming:
    """When one request's tokens came and what it ended with: computed once, where the manager
    hands a stream's chunks out, and read by everyone who reports on it — this module's log
    line, the server's per-request stats and inter-token histogram (``on_gap``), the TUI's
    request log and tokens/s (``ModelManager.observe_requests``).

    Times are ``time.perf_counter()`` readings. A token is a chunk with text or reasoning;
    ``started`` is when the stream was asked for (a load may follow), ``admitted_at`` when its
    model was loaded and the request admitted: each reader measures from the start it means.
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self.started = time.perf_counter()
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.tokens = 0
        self.usage: Usage | None = None
        self.finish: str | None = None
        self.ended = False
        self.failed = False  # ended by an error or by its reader leaving, not by its last chunk
        self.cancelled = False  # … after its caller's Cancel was set
        self._gap_listeners: list[Callable[[float], None]] = []
        self._end_listeners: list[Callable[[RequestTiming], None]] = []

    def on_gap(self, listener: Callable[[float], None]) -> None:
        """Call ``listener(seconds)`` with each gap between two tokens (the server's ITL histogram)."""
        self._gap_listeners.append(listener)

    def on_end(self, listener: Callable[[RequestTiming], None]) -> None:
        """Call ``listener(self)`` once the stream is over, however it ended."""
        self._end_listeners.append(listener)

    def note(self, chunk: Chunk) -> None:
        if chunk.text or chunk.reasoning:
            now = time.perf_counter()
            last = self.last_token_at
            if last is None:
                self.first_token_at = now
            else:
                for listener in self._gap_listeners:
                    listener(now - last)
            self.last_token_at = now
            self.tokens += 1
        if chunk.usage:
            self.usage = chunk.usage
        if chunk.finish_reason:
            self.finish = chunk.finish_reason

    def end(self, *, failed: bool, cancelled: bool = False) -> None:
        self.ended, self.failed, self.cancelled = True, failed, cancelled
        for listener in self._end_listeners:
            try:
                listener(self)
            except Exception:  # noqa: BLE001 - a display hook must never fail a request
                log.exception("request timing listener failed")

    @property
    def prompt_tokens(self) -> int:
        return self.usage.prompt_tokens if self.usage else 0

    @property
    def completion_tokens(self) -> int:
        """The runtime's count once its usage arrived; the tokens seen until then."""
        return self.usage.completion_tokens if self.usage else self.tokens

    @property
    def decode_rate(self) -> float | None:
        """Tokens per second after the first; None before two tokens."""
        n, first, last = self.completion_tokens, self.first_token_at, self.last_token_at
        if n < 2 or first is None or last is None or last <= first:
            return None
        return (n - 1) / (last - first)


def start_timing(model: str, observers: Iterable[Callable[[RequestTiming], None]]) -> RequestTiming:
    """A new request's timing, shown to each of ``observers`` first (the manager's request listeners)."""
    timing = RequestTiming(model)
    for observer in observers:
        try:
            observer(timing)
        except Exception:  # noqa: BLE001 - a display hook must never fail a request
            log.exception("request listener failed")
    return timing


class Watch:
    """The activity log's line of one request: written from its timing when it ends (or why it was refused)."""

    def __init__(self, lm: Any, req: Any, timing: RequestTiming) -> None:
        self.lm, self.kind = lm, type(req).__name__.replace("Request", "").lower()
        tools = len(getattr(req, "tools", None) or ())
        if tools:  # an agent's request carries its whole tool list: the count shows it arrived
            self.kind += f" with {tools} tools"
        self.timing = timing
        timing.admitted_at = time.perf_counter()

    def refused(self, exc: LocalrunError) -> None:
        """Log why the request was refused; an overflow gets the hint that names its fix first (in place)."""
        if isinstance(exc, ContextOverflow):
            with_context_hint(exc, self.lm.record, self.lm.plan.runtime)
        hint = f" ({exc.hint})" if exc.hint else ""
        log.warning("%s: %s refused: %s%s", self.lm.name, self.kind, exc.message, hint)

    def done(self) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        t = self.timing
        t0 = t.admitted_at or t.started
        prefill_s = (t.first_token_at or time.perf_counter()) - t0
        prompt = t.prompt_tokens
        prefill_rate = f", {prompt / prefill_s:.0f} tok/s" if prompt and prefill_s > 0 else ""
        log.info(
            "%s: %s of %d prompt tokens (context %d): first token after %.1f s%s; %d tokens at %.1f tok/s; %s",
            self.lm.name,
            self.kind,
            prompt,
            self.lm.plan.n_ctx,
            prefill_s,
            prefill_rate,
            t.completion_tokens,
            t.decode_rate or 0.0,
            t.finish or "stopped",
        )


def watched(
    lm: Any, req: Any, chunks: Iterator[Chunk], timing: RequestTiming, cancel: Cancel | None = None
) -> Iterator[Chunk]:
    """``chunks`` timed by ``timing``, a line in the activity log at the end, and overflow errors naming their fix."""
    watch = Watch(lm, req, timing)
    complete = False
    try:
        for chunk in chunks:
            timing.note(chunk)
            yield chunk
        complete = True
    except LocalrunError as exc:
        watch.refused(exc)
        raise
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:  # a reader that left early cancels the request now, not at garbage collection
            close()
        timing.end(failed=not complete, cancelled=cancel is not None and cancel.is_set())
    watch.done()


async def awatched(lm: Any, req: Any, chunks: AsyncIterator[Chunk], timing: RequestTiming) -> AsyncIterator[Chunk]:
    """The asynchronous twin of :func:`watched`."""
    watch = Watch(lm, req, timing)
    complete = False
    try:
        async for chunk in chunks:
            timing.note(chunk)
            yield chunk
        complete = True
    except LocalrunError as exc:
        watch.refused(exc)
        raise
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:  # a reader that left early cancels the request now, not at garbage collection
            await aclose()
        timing.end(failed=not complete)
    watch.done()


class OpenStream:
    """An admitted request whose chunks have not been read yet (see ``ModelManager.aopen``): read
    through its timing, and its place in the model's queue released once, read or not."""

    def __init__(
        self, residency: Residency, lm: LoadedModel, req: ChatRequest | CompletionRequest, timing: RequestTiming
    ) -> None:
        self.record = lm.record
        self.plan = lm.plan
        self.capabilities = lm.handle.capabilities
        #: The request's timing (localrun.activity): the server's stats and metrics read it.
        self.timing = timing
        self._residency, self._lm, self._req = residency, lm, req
        self._released = False

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._residency.release(self._lm)
            if not self.timing.ended:  # closed unread (a field the runtime cannot honour)
                self.timing.end(failed=True)

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        from localrun.worker.host import aiter_chunks

        try:
            chunks = aiter_chunks(self._lm.handle, self._req)
            async for chunk in awatched(self._lm, self._req, chunks, self.timing):
                yield chunk
        finally:
            self._release()

    async def aclose(self) -> None:
        self._release()
