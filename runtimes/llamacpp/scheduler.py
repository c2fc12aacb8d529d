"""Continuous batching inside the llama.cpp worker: one context, several sequences.

One scheduler thread owns the context. Each step it

1. ends what was cancelled (per request) and gives free slots to waiting requests, each
   with the longest cached prefix of its prompt already in its slot (:mod:`.cache.prefix`);
2. prefills prompt chunks of the requests still reading their prompt, up to ``step_tokens``
   tokens per step, round robin: a long prompt delays the others by one chunk per step at
   most, and a short one is not stuck behind it;
3. decodes the next token of every running sequence (one ``llama_decode`` per group of up to
   7) and samples each with the request's own C sampler chain (temperature, top-p, seed, …);
   a sequence whose drafted continuation pays (speculative decoding, :mod:`.speculative.drafting`;
   drafts from the n-gram lookup or a draft model, :mod:`.speculative.draft_model`)
   verifies it in a call of its own instead and may gain several tokens in the step
   (:mod:`.speculative.step`).

Images and audio: a media chunk is prefilled in its request's turn, its encode running on a
thread of its own meanwhile (:mod:`.media.prefill` says how the two interleave).

Request threads never touch llama.cpp: they submit a :class:`Job` and read its chunks from
a queue. New requests join at the next step; finished ones leave and keep their KV. Other
native compute of the worker (embeddings) is handed to this thread too (:meth:`Scheduler.call`,
:mod:`.calls` says why) and runs between two steps.

Why each prefill chunk is its own ``llama_decode`` call, apart from the decode tokens:
with one KV stream per sequence llama.cpp splits a mixed batch into per-sequence micro-
batches anyway (``split_equal``), so it costs no extra pass; and it keeps every sequence's
arithmetic independent of what else runs.

Exactness (why a greedy answer is the same alone or batched, and what ``exact_prefix`` buys) is
a property of the :class:`~.cache.slots.Layout` the scheduler runs: :mod:`.cache.slots` says
what was measured.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from localrun.errors import LocalrunError, RuntimeUnavailable
from localrun.runtimes.llamacpp.cache.checkpoints import CheckpointKv, context_kv, marks
from localrun.runtimes.llamacpp.cache.prefix import PrefixCache
from localrun.runtimes.llamacpp.cache.slots import Layout, chunk_size
from localrun.runtimes.llamacpp.calls import ThreadCalls
from localrun.runtimes.llamacpp.decode import fill_batch
from localrun.runtimes.llamacpp.decode_calls import DecodeCalls
from localrun.runtimes.llamacpp.job import Job
from localrun.runtimes.llamacpp.media.prefill import MediaEncoder, MediaPrefill
from localrun.runtimes.llamacpp.speculative.drafting import MAX_DRAFT, SpecState, SpecTotals
from localrun.runtimes.llamacpp.speculative.pass_costs import DecodeCosts
from localrun.runtimes.llamacpp.speculative.step import SpeculativeStep, speculation_mode
from localrun.types import Chunk

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.kv_disk import DiskTier
    from localrun.runtimes.llamacpp.cache.slot import Slot
    from localrun.runtimes.llamacpp.decode import Sampler
    from localrun.runtimes.llamacpp.media.mtmd import Projector
    from localrun.runtimes.llamacpp.media.prompt import MediaSpan
    from localrun.runtimes.llamacpp.speculative.draft_model import DraftModel

T = TypeVar("T")

log = logging.getLogger(__name__)
#: Prompts at least this long log their prefill progress at INFO, one line per chunk.
PROGRESS_MIN_TOKENS = 2048


class Scheduler:
    """Owns one llama.cpp context on its own thread and runs many requests in it.

    It holds its collaborators: the prefix cache (``cache``), the ``llama_decode`` calls
    (:class:`DecodeCalls`), the media prefill and, when speculation is on, the speculative step."""

    def __init__(
        self,
        llama: Any,
        ctx: Any,
        layout: Layout,
        *,
        n_swa: int,
        piece_of: Callable[[int], bytes],
        is_eog: Callable[[int], bool],
        speculative: str = "off",
        draft_k: int | None = None,
        drafter: DraftModel | None = None,
        projector: Projector | None = None,
        disk: DiskTier | None = None,
        memory: str | None = None,
    ) -> None:
        self._llama, self._ctx, self.layout = llama, ctx, layout
        self._piece_of, self._is_eog = piece_of, is_eog
        self._batch = llama.llama_batch_init(max(layout.step_tokens, layout.n_slots, MAX_DRAFT + 1), 0, 1)
        # Memory that cannot be cut ("recurrent", "hybrid", "swa") gets checkpoints (checkpoints.py).
        self._kv, self._buffers = context_kv(llama, ctx, layout, n_swa=n_swa, memory=memory, saves=disk is not None)
        self._ckpt = self._kv if isinstance(self._kv, CheckpointKv) else None
        # Speculation (speculative.py): "off", "auto" (adaptive) or "ngram" (draft_k tokens whenever a match is found).
        self.costs = DecodeCosts()
        self.speculative = speculation_mode(speculative, layout)
        self._draft_k = draft_k if speculative in ("ngram", "draft") else None
        #: The draft model (draft_model.DraftModel), when one is loaded: drafts where the n-gram
        #: lookup has none (auto), or every draft (draft mode). Called from this thread only.
        self.drafter = drafter if self.speculative in ("auto", "draft") else None
        self.spec_totals = SpecTotals()
        self.cache = PrefixCache(
            layout.n_slots,
            self._kv,
            min_tail=layout.min_chunk,
            host_budget=layout.host_cache_bytes,
            reuse=layout.prefix_cache,
            disk=disk,  # kv_disk.DiskTier or None (prefix_disk.py)
            buffers=self._buffers,
        )
        self._inbox: list[Job] = []
        self._calls = ThreadCalls()  # native work of request threads (embeddings), run between steps
        self._wake = threading.Condition()
        self._stopping = False
        self._broken: str | None = None
        self._waiting: collections.deque[Job] = collections.deque()
        self._prefilling: collections.deque[Job] = collections.deque()
        self._decoding: list[Job] = []  # sorted by slot: consecutive sequences share a micro-batch
        self._calibrated = threading.Event()
        self._decode = DecodeCalls(
            llama, ctx, self._batch, layout, self.cache, finish=self._finish, running=self.running
        )
        self.encoder = MediaEncoder(projector, self._notify) if projector is not None else None
        self._media = MediaPrefill(llama, ctx, layout.step_tokens, self.encoder, self._decode, self._finish)
        self._spec = None
        if self.speculative != "off":
            self._spec = SpeculativeStep(
                llama,
                ctx,
                layout,
                self._kv,
                mode=self.speculative,
                costs=self.costs,
                totals=self.spec_totals,
                drafter=self.drafter,
                is_eog=is_eog,
                decode=self._decode,
                emit=self._emit,
            )
        self._thread = threading.Thread(target=self._run, name="llama-scheduler", daemon=True)
        self._thread.start()
        self._calibrated.wait(120)  # loading ends once the pass sizes are timed (on that thread)

    # --- request threads --------------------------------------------------------------------

    def stream(self, job: Job) -> Iterator[Chunk]:
        """Submit ``job`` and yield its chunks. Closing the generator early cancels the job."""
        self.submit(job)
        yield from job.read()

    def submit(self, job: Job) -> None:
        """Hand ``job`` to the scheduler thread; its chunks come out of ``job.out`` (see :meth:`stream`)."""
        with self._wake:
            self._check_running()
            self._inbox.append(job)
            self._wake.notify()

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the scheduler thread between two steps and return its result (or raise
        its error) here: the way other native compute of this worker stays on one thread."""
        if threading.current_thread() is self._thread:
            return fn()
        with self._wake:
            self._check_running()
            future = self._calls.add(fn)
            self._wake.notify()
        return future.result()

    def _check_running(self) -> None:
        if self._broken or self._stopping:
            raise RuntimeUnavailable(
                f"the llama.cpp scheduler is not running ({self._broken or 'closed'})", hint="load the model again"
            )

    def close(self, timeout_s: float = 30.0) -> None:
        """End every request ("cancelled") and stop the thread; the caller frees the context after."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeUnavailable("the llama.cpp scheduler did not stop", hint="kill the worker process")
        try:  # the thread is gone: this one may touch the context. Every prefix goes to disk first.
            self.cache.persist()
        except Exception:  # noqa: BLE001 - a failed write loses a cache, never the unload
            log.warning("writing the prefix cache to disk failed", exc_info=True)
        if self._buffers is not None:
            self._buffers.close()
        if self.encoder is not None:
            self.encoder.close()
        if self._batch is not None:
            self._llama.llama_batch_free(self._batch)
            self._batch = self._decode.batch = None

    def running(self) -> int:
        return len(self._waiting) + len(self._decoding) + len(self._prefilling)

    def jobs_by_slot(self) -> dict[int, Job]:
        """The requests holding a slot, by its sequence (on the scheduler thread: through :meth:`call`)."""
        return {j.slot.seq: j for j in (*self._prefilling, *self._decoding) if j.slot is not None}

    # --- the scheduler thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            try:
                if self._spec is not None:
                    self._spec.calibrate()
                self._warm()
            finally:
                self._calibrated.set()
            while True:
                with self._wake:
                    while not (
                        self._inbox
                        or self._calls
                        or self._stopping
                        or self._waiting
                        or self._media.can_prefill(self._prefilling)  # not while every prefill waits for its encode
                        or self._decoding
                    ):
                        self._wake.wait(0.1 if self._prefilling else None)  # 0.1: a cancel ends an encode's wait
                    new, self._inbox = self._inbox, []
                    calls, stopping = self._calls.take(), self._stopping
                self._waiting.extend(new)
                if stopping:
                    ThreadCalls.fail(
                        calls, RuntimeUnavailable("the llama.cpp scheduler closed", hint="load the model again")
                    )
                    self._end_all("cancelled")
                    return
                ThreadCalls.run(calls)
                self._reap()
                self._admit()
                self._prefill_step()  # first: a newcomer's first token does not wait for a decode pass
                self._decode_step()
                self._let_readers_run()
        except BaseException as exc:  # noqa: BLE001 - every open request must hear about it
            log.exception("the llama.cpp scheduler failed")
            err = (
                exc
                if isinstance(exc, LocalrunError)
                else LocalrunError(
                    f"the llama.cpp scheduler failed: {type(exc).__name__}: {exc}", hint="reload the model"
                )
            )
            with self._wake:
                self._broken = f"{type(exc).__name__}: {exc}"
                orphans, self._inbox = self._inbox, []
                calls = self._calls.take()
            ThreadCalls.fail(calls, err)
            for job in [*self._waiting, *self._prefilling, *self._decoding, *orphans]:
                job.out.put(err)

    def _warm(self) -> None:
        """The disk tier's newest prefix into a slot, part of loading (prefix.PrefixCache.warm):
        a read and a restore, ~20 ms for a 16k-token Gemma state. A failure only loses the head start."""
        try:
            self.cache.warm()
        except Exception:  # noqa: BLE001 - never fail a load over the cache
            log.warning("starting a slot warm from the disk cache failed", exc_info=True)

    def _let_readers_run(self, limit_s: float = 0.002) -> None:
        """Give the request threads a moment to take their chunks before the next pass: work
        they do while ggml computes takes a core from one of its threads, and the others spin
        at its barrier meanwhile."""
        jobs = self._decoding
        if not jobs:
            return
        deadline = time.monotonic() + limit_s
        while not all(j.parked for j in jobs) and time.monotonic() < deadline:
            os.sched_yield()

    def _reap(self) -> None:
        for jobs in (self._waiting, self._prefilling, self._decoding):
            for job in [j for j in jobs if j.abandoned or j.cancel.is_set()]:
                self._finish(job, "cancelled", job.text.finish() if job in self._decoding else "")

    def _admit(self) -> None:
        while self._waiting and self.cache.free_slots():
            # The first in line, passing over requests pinned to a busy slot (id_slot): they wait for theirs.
            job = next((j for j in self._waiting if j.id_slot < 0 or not self.cache.slots[j.id_slot].busy), None)
            if job is None:
                return
            # Spare the idle slots that the next waiting requests would reuse.
            ahead = itertools.islice(self._waiting, 1, 1 + 2 * self.layout.n_slots)
            spare = frozenset(
                seq for j in ahead if (seq := j.id_slot if j.id_slot >= 0 else self.cache.wanted(j.prompt)) is not None
            )
            got = (
                self.cache.acquire_at(job.prompt, job.id_slot)
                if job.id_slot >= 0
                else self.cache.acquire(job.prompt, spare=spare)
            )
            if got is None:
                return
            self._waiting.remove(job)
            job.slot, job.cached = got
            job.sampler = job.build_sampler()
            if self.speculative != "off":
                job.spec = SpecState(job.prompt, fixed_k=self._draft_k)
            if job.media is not None:
                self._media.admitted(job)
            self._prefilling.append(job)

    def _decode_step(self) -> None:
        jobs = list(self._decoding)
        if not jobs:
            return
        if self._spec is not None:
            jobs = self._spec.speculate(jobs)
            if not jobs:
                return
        # Consecutive sequences, near-equal groups of at most decode_rows: one call per group.
        n_calls = -(-len(jobs) // self.layout.decode_rows)
        size = -(-len(jobs) // n_calls)
        for start in range(0, len(jobs), size):
            self._decode_group(jobs[start : start + size])

    def _decode_group(self, jobs: list[Job]) -> None:
        # A decoding job holds its slot and sampler from admission to its end: cast, never checked here.
        fill_batch(
            self._batch,
            [j.pending for j in jobs],
            [len(cast("Slot", j.slot).tokens) for j in jobs],
            [cast("Slot", j.slot).seq for j in jobs],
            True,
        )
        started = time.perf_counter()
        if not self._decode.run(jobs):
            return
        self.costs.observe_plain(len(jobs), time.perf_counter() - started)
        ctx = self._ctx
        for i, job in enumerate(jobs):
            cast("Slot", job.slot).tokens.append(job.pending)
            self._emit(job, cast("Sampler", job.sampler).sample(ctx, i))

    def _prefill_step(self) -> None:
        budget, first = self.layout.step_tokens, True
        for _ in range(len(self._prefilling)):
            job = self._prefilling[0]
            start = len(cast("Slot", job.slot).tokens)  # a prefilling job holds its slot
            piece = self._media.next_piece(job, start)  # text up to the next media chunk, or that chunk
            if piece is None:  # its image is being encoded: the others go on meanwhile
                self._prefilling.rotate(-1)
                continue
            run, span = piece
            n = run if span is not None else chunk_size(run, self.layout.step_tokens, self.layout.min_chunk)
            if self._ckpt is not None and span is None:  # end the chunk where a checkpoint is due
                n = self._ckpt.clip(start, n, len(job.prompt), self.layout.min_chunk, *marks(job.prompt, job.slot))
            if not first and n > budget:
                return
            self._prefilling.rotate(-1)
            budget -= n
            first = False
            self._prefill_chunk(job, start, n, span)
            if budget <= 0:
                return

    def _prefill_chunk(self, job: Job, start: int, n: int, span: MediaSpan | None = None) -> None:
        chunk = job.prompt[start : start + n]
        last = start + n == len(job.prompt)
        if job.prefill_began is None:
            job.prefill_began = (time.perf_counter(), start)
        if span is not None:
            row = self._media.decode(job, span, last)
        else:
            fill_batch(self._batch, chunk, range(start, start + n), cast("Slot", job.slot).seq, False)
            self._batch.logits[n - 1] = last  # the prompt's last position is sampled from
            timed = time.perf_counter()
            row = n - 1 if self._decode.run([job]) else None
            self.cache.observe_prefill(n, time.perf_counter() - timed)  # what a disk read is weighed against
        if row is None:
            return
        began_at, began_from = job.prefill_began
        end, total = start + n, len(job.prompt)
        if total - began_from >= PROGRESS_MIN_TOKENS and 10 * end // total > 10 * start // total:
            # A long prompt takes minutes on a few cores: say how far it is, every tenth (``launch`` shows this log).
            elapsed = time.perf_counter() - began_at
            rate = (end - began_from) / elapsed if elapsed > 0 else 0.0
            log.info("prefill %d/%d tokens (%.0f%%), %.0f tok/s", end, total, 100 * end / total, rate)
        slot = cast("Slot", job.slot)  # still held: a failed decode returned above
        slot.tokens.extend(chunk)
        self.cache.extended(slot, getattr(job.prompt, "turn", None))  # turns.TurnPrompt
        if self._ckpt is not None and span is None:
            self._ckpt.taken_at(slot.seq, start + n, len(job.prompt), *marks(job.prompt, slot))
        if not last:
            return
        self._prefilling.remove(job)
        if job.limit <= 0:
            self._finish(job, "length")
            return
        self._decoding.append(job)
        self._decoding.sort(key=lambda j: cast("Slot", j.slot).seq)
        self._emit(job, cast("Sampler", job.sampler).sample(self._ctx, row))

    def _emit(self, job: Job, token: int) -> None:
        """One sampled token: end the job (EOG, stop string, limit) or stream its text."""
        if self._is_eog(token):
            self._finish(job, "stop", job.text.finish())
            return
        job.produced += 1
        if job.spec is not None:
            job.spec.pushed(token)
        piece, stopped = job.text.feed(self._piece_of(token))
        if stopped:
            self._finish(job, "stop", piece)
        elif job.produced >= job.limit:
            self._finish(job, "length", piece + job.text.finish())
        else:
            if piece:
                job.out.put(Chunk(text=piece, logprobs=job.take_logprobs()))
            job.pending = token

    def _finish(self, job: Job, reason: str | None, tail: str = "", *, error: LocalrunError | None = None) -> None:
        self._media.done(job)
        for jobs in (self._waiting, self._prefilling):
            if job in jobs:
                jobs.remove(job)
        if job in self._decoding:
            self._decoding.remove(job)
        if job.sampler is not None:
            job.sampler.free()
            job.sampler = None
        if job.slot is not None:  # freed before the last chunk goes out: a reader sees a free slot
            if error is not None:
                self.cache.drop(job.slot)
            else:
                self.cache.release(job.slot)
            job.slot = None
        job.out.put(error if error is not None else job.final(cast(str, reason), tail))  # None only with an error

    def _end_all(self, reason: str) -> None:
        for job in [*self._waiting, *self._prefilling, *self._decoding]:
            self._finish(job, reason, job.text.finish() if job in self._decoding else "")
