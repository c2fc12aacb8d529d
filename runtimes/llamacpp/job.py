"""One request inside the llama.cpp scheduler (:mod:`.scheduler`): its prompt, limits,
sampler, slot, text so far, drafting state and media chunks."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast

from localrun.runtimes.llamacpp.cache.slot import Slot
from localrun.runtimes.llamacpp.media.prompt import MediaPrompt
from localrun.runtimes.llamacpp.speculative.drafting import SpecState
from localrun.runtimes.llamacpp.text import TextAssembler
from localrun.types import Cancel, Chunk, Usage

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.decode import Sampler
    from localrun.runtimes.llamacpp.media.prefill import Ticket


class Outbox(Protocol):
    """Where the scheduler puts a job's chunks (and the error that ends it): the job's own queue,
    or a choice's tagged view of a shared one (choices.py)."""

    def put(self, item: Chunk | BaseException) -> None: ...


class Job:
    """One request inside the scheduler. Request threads read ``out``; only the scheduler
    thread writes the other fields."""

    __slots__ = (
        "prompt",
        "limit",
        "cancel",
        "out",
        "slot",
        "sampler",
        "text",
        "produced",
        "cached",
        "pending",
        "abandoned",
        "build_sampler",
        "logprobs",
        "parked",
        "spec",
        "media",
        "encodes",
        "id_slot",
        "prefill_began",
    )

    def __init__(
        self,
        prompt: list[int],
        *,
        limit: int,
        stops: tuple[str, ...],
        cancel: Cancel,
        build_sampler: Callable[[], Sampler],
        logprobs: list[dict[str, Any]] | None = None,
        media: MediaPrompt | None = None,
        id_slot: int = -1,
    ) -> None:
        self.prompt = prompt
        self.limit = limit
        self.cancel = cancel
        # Called on the scheduler thread: returns an object with ``sample(ctx, index)`` and
        # ``free()`` (a ChainSampler, or a grammar-constrained one); freed there too.
        self.build_sampler = build_sampler
        self.out: Outbox = queue.SimpleQueue()
        self.slot: Slot | None = None
        self.sampler: Sampler | None = None
        self.text = TextAssembler(stops)
        self.produced = 0
        self.cached = 0
        self.pending = -1
        self.abandoned = False
        self.parked = False  # the reader is back, waiting for the next chunk
        # Log-probability entries the sampler appends (a LogprobSampler), not yet sent: they
        # go out with the next chunk, so a token whose text is held back is not lost.
        self.logprobs = logprobs
        self.spec: SpecState | None = None  # drafting state, when speculation is on (speculative.py)
        # The prompt's media chunks (``prompt`` holds their pseudo ids, media/prompt.py) and their
        # queued encodes by chunk start (media/prefill.py); shared by the choices of one request.
        self.media = media
        self.encodes: dict[int, Ticket] = {}
        self.id_slot = id_slot  # the slot asked for (llama-server's id_slot); -1: the cache picks
        self.prefill_began: tuple[float, int] | None = None  # (time, position) its prefill began: progress logs

    def usage(self) -> Usage:
        spec = self.spec
        return Usage(
            prompt_tokens=len(self.prompt),
            completion_tokens=self.produced,
            cached_tokens=self.cached,
            drafted_tokens=spec.drafted if spec else 0,
            accepted_tokens=spec.accepted if spec else 0,
        )

    def take_logprobs(self) -> tuple[dict[str, Any], ...]:
        if not self.logprobs:
            return ()
        out = tuple(self.logprobs)
        self.logprobs.clear()
        return out

    def final(self, reason: str, tail: str = "") -> Chunk:
        return Chunk(text=tail, finish_reason=reason, usage=self.usage(), logprobs=self.take_logprobs())

    def read(self) -> Iterator[Chunk]:
        """The request thread's side: this job's chunks as the scheduler puts them out, to the
        last. Closing the generator early abandons the job (the scheduler frees its slot)."""
        done = False
        out = cast("queue.SimpleQueue[Chunk | BaseException]", self.out)  # its own: a choice is read in choices.py
        try:
            while True:
                self.parked = True
                item = out.get()
                self.parked = False
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if item.finish_reason is None and self.cancel.is_set():
                    # Chunks made before the scheduler saw the cancel are dropped: the stream
                    # ends at once, and the scheduler frees the slot at its next step.
                    done = True
                    self.abandoned = True
                    yield self.final("cancelled")
                    return
                done = item.finish_reason is not None
                yield item
                if done:
                    return
        finally:
            if not done:
                self.abandoned = True
