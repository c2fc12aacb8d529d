"""The scheduler's speculative steps: draft, verify in one pass, keep the agreeing prefix.

One object the :class:`~..scheduler.Scheduler` holds when speculation is on; the drafts and the
policy that decides when they pay are :mod:`.drafting`.

Why each verification is its own ``llama_decode`` call: with one KV stream per sequence,
llama.cpp splits a batch into micro-batches with the same number of rows per sequence, so a
sequence's k+1 rows beside other sequences' single rows would cost k+1 passes. Rounding: a pass
of several rows of one sequence goes through batched kernels (ggml's CPU flash attention
takes a tiled path for several query rows and a split-KV path for one row over 512+ cells;
the matmuls tile differently), so its logits are not bit for bit a one-row step's: greedy
answers agree except where two tokens are within rounding of each other
(docs/architecture.md, "Speculative decoding"). :func:`calibrate` times passes at load.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from localrun.runtimes.llamacpp.decode import fill_batch
from localrun.runtimes.llamacpp.speculative.drafting import CALIBRATED_ROWS, MAX_DRAFT, MIN_RUN

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.slot import KvOps, Slot
    from localrun.runtimes.llamacpp.cache.slots import Layout
    from localrun.runtimes.llamacpp.decode import Sampler
    from localrun.runtimes.llamacpp.decode_calls import DecodeCalls
    from localrun.runtimes.llamacpp.job import Job
    from localrun.runtimes.llamacpp.speculative.draft_model import DraftModel
    from localrun.runtimes.llamacpp.speculative.drafting import SpecState, SpecTotals
    from localrun.runtimes.llamacpp.speculative.pass_costs import DecodeCosts

log = logging.getLogger(__name__)

PROBE_CONTEXT = 48
#: One-row steps compared, logit by logit, with the same positions in a pass at load.
PROBE_ROWS = 8


def speculation_mode(mode: str, layout: Layout) -> str:
    """The mode a scheduler runs: ``auto`` drafts in any layout but ``exact_prefix``, whose promise
    is bit-exact answers (a pass rounds like a batched step, see the module docstring); ``ngram``
    drafts regardless, as asked. Pass costs are timed at load when drafting is on."""
    if mode == "auto" and layout.exact_prefix:
        log.info(
            "speculative decoding off: exact_prefix asks for bit-exact answers, and a verification "
            "pass rounds like a batched step"
        )
        return "off"
    return mode


class SpeculativeStep:
    """The scheduler's speculation, held by it (mode ``auto``, ``ngram`` or ``draft``): drafts for
    the sequences whose drafts pay, one verification pass each, and the pass costs timed at load.

    ``costs`` and ``totals`` are the scheduler's (it reports them); ``decode`` its
    :class:`~..decode_calls.DecodeCalls`; ``emit(job, token)`` hands it each kept token."""

    def __init__(
        self,
        llama: Any,
        ctx: Any,
        layout: Layout,
        kv: KvOps,
        *,
        mode: str,
        costs: DecodeCosts,
        totals: SpecTotals,
        drafter: DraftModel | None,
        is_eog: Callable[[int], bool],
        decode: DecodeCalls,
        emit: Callable[[Job, int], None],
    ) -> None:
        self._llama, self._ctx, self.layout, self._kv = llama, ctx, layout, kv
        self.speculative, self.costs, self.spec_totals, self.drafter = mode, costs, totals, drafter
        self._is_eog, self._decode, self._emit = is_eog, decode, emit

    def speculate(self, jobs: list[Job]) -> list[Job]:
        """Verify a draft for every sequence whose draft pays, each in its own call (a
        sequence's rows must not share a micro-batch with other sequences', see the module
        docstring); return the jobs left to decode plainly. Drafts come from the n-gram
        index first; where it has none (or in ``draft`` mode) from the draft model, one
        batched call for all the sequences that want one."""
        rows_now = min(len(jobs), self.layout.decode_rows)
        drafts: dict[int, list[int]] = {}
        draft: list[int] | None
        wants: list[tuple[Job, int]] = []
        for job in jobs:
            if job.spec is None:
                continue
            room = self._room(job)
            draft = self._ngram_draft(job, room, rows_now) if self.speculative != "draft" else []
            if draft:
                drafts[id(job)] = draft
                job.spec.source = "ngram"
            elif self.drafter is not None and room > 0:
                k = job.spec.model_policy.choose(room, self.costs, rows_now, draft_cost=self.costs.draft_token()).k
                if k:
                    wants.append((job, k))
        if wants:
            drafter = cast("DraftModel", self.drafter)  # only a drafter makes wants
            drafted_before = drafter.seconds
            got = drafter.propose(
                [(cast("Slot", j.slot).seq, [*cast("Slot", j.slot).tokens, j.pending], k) for j, k in wants]
            )  # decoding jobs: each holds its slot
            self.costs.observe_draft(drafter.seconds - drafted_before, max(k for _, k in wants))
            for (job, _), draft in zip(wants, got):
                draft = self._grammar_cut(job, draft)
                if draft:
                    drafts[id(job)] = draft
                    cast("SpecState", job.spec).source = "model"
        plain: list[Job] = []
        for job in jobs:
            draft = drafts.get(id(job))
            if not (draft and self._verify(job, draft)) and job.slot is not None:
                plain.append(job)
        return plain

    def calibrate(self) -> None:
        """Time the pass sizes (calibrate, below) on the scheduler's own thread, before
        any request: every decode of this context then runs on one thread. (llama.cpp's OpenMP
        keeps a thread team per calling thread; two teams on two cores slowed every later step
        by ~10 %, measured when the load ran this on the loading thread.)"""
        calibrate(self._llama, self._ctx, self._decode.batch, self.costs)
        log.info(
            "speculative decoding %s: a pass's best logits round by up to %.2g from one-row steps here",
            self.speculative,
            self.costs.rounding,
        )

    def _room(self, job: Job) -> int:
        """Most tokens a draft may hold: k+1 rows at positions base..base+k must fit the slot,
        and k+1 tokens the request's limit."""
        tokens = cast("Slot", job.slot).tokens  # a decoding job holds its slot
        return min(MAX_DRAFT, self.layout.slot_ctx - 1 - len(tokens), job.limit - job.produced - 1)

    def _ngram_draft(self, job: Job, room: int, rows_now: int) -> list[int]:
        spec = cast("SpecState", job.spec)  # drafting jobs only
        if room <= 0:
            return []
        proposal = self._grammar_cut(job, spec.index.propose(room))
        if not proposal:
            return []
        decision = spec.policy.choose(len(proposal), self.costs, rows_now, run=spec.index.run, min_run=MIN_RUN)
        if decision.k == 0:
            spec.policy.shadow(proposal)
        return proposal[: decision.k]

    @staticmethod
    def _grammar_cut(job: Job, proposal: list[int]) -> list[int]:
        check = getattr(job.sampler, "valid_prefix", None)
        if proposal and check is not None:
            proposal = proposal[: check(proposal)]  # a token the grammar forbids would be rejected anyway
        return proposal

    def _verify(self, job: Job, draft: list[int]) -> bool:
        """One pass over the pending token and ``draft``; keep the agreeing prefix and the
        model's own next token. False when the KV cache has no room for the extra rows now
        (the job then decodes plainly)."""
        slot, ctx = cast("Slot", job.slot), self._ctx
        base, rows = len(slot.tokens), [job.pending, *draft]
        fill_batch(self._decode.batch, rows, range(base, base + len(rows)), slot.seq, True)
        started = time.perf_counter()
        rc = self._decode.rc()
        if rc == 1:
            return False
        if rc != 0:
            self._decode.fail([job], rc)
            return True
        self.costs.observe_verify(len(rows), time.perf_counter() - started)
        entries = job.logprobs
        start = len(entries) if entries is not None else 0
        tokens: list[int] = []
        marks: list[int] = []
        kept = 0
        for i in range(
            len(rows)
        ):  # in order, stopping at the first disagreement: the sampler sees what plain decoding shows it
            token = cast("Sampler", job.sampler).sample(ctx, i)
            tokens.append(token)
            marks.append(len(entries) if entries is not None else 0)
            if i == len(draft) or token != draft[i]:
                break
            kept += 1
            if self._is_eog(token):
                break
        if kept < len(draft):
            self._kv.truncate(slot.seq, base + 1 + kept)  # the rejected drafts leave the KV cache
        slot.tokens.extend(rows[: 1 + kept])
        cast("SpecState", job.spec).verified(len(draft), kept)
        self.spec_totals.add(len(draft), kept)
        held = entries[start:] if entries is not None else []
        if entries is not None:
            del entries[start:]
        done = start
        for token, mark in zip(tokens, marks):
            if entries is not None:  # a token's logprob entries go out with it, none for tokens never emitted
                entries.extend(held[done - start : mark - start])
                done = mark
            self._emit(job, token)
            if job.slot is None:
                break
        return True


def calibrate(llama: Any, ctx: Any, batch: Any, costs: DecodeCosts, *, seq: int = 0, repeats: int = 2) -> None:
    """Time one-row steps and passes of each size in ``CALIBRATED_ROWS`` on this build, model and context (on
    ``seq``, left empty after), into ``costs``: the policy's first decisions then rest on
    this machine's numbers, not a guess. A pass's cost is far from linear on a CPU (measured
    here, see ``PASS_ROWS``), and which drafts pay depends on exactly that. Costs ~40 one-row
    steps at load (~0.5 s for Gemma 3 270M on 2 cores). Also measures how far a pass's rows
    round from the same steps alone, at their best few logits (``costs.rounding``, logged:
    measured here 2e-8 for the tiny F32 model, ~2 for Gemma 3 270M, whose attention takes
    another ggml kernel for several rows)."""
    import numpy as np

    mem = llama.llama_get_memory(ctx)
    n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(llama.llama_get_model(ctx)))
    context = [(7 + 13 * i) % n_vocab for i in range(PROBE_CONTEXT)]
    tokens = [(11 + 17 * i) % n_vocab for i in range(MAX_DRAFT + 1)]
    try:
        for start in range(0, PROBE_CONTEXT, len(tokens)):
            chunk = context[start : start + len(tokens)]
            fill_batch(batch, chunk, range(start, start + len(chunk)), seq, False)
            if llama.llama_decode(ctx, batch) != 0:
                return

        def logits(row: int) -> np.ndarray:
            return np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, row), shape=(n_vocab,)).copy()

        alone, steps = [], []
        for j in range(PROBE_ROWS):  # one-row steps, as plain decoding makes them
            fill_batch(batch, [tokens[j]], [PROBE_CONTEXT + j], seq, True)
            started = time.perf_counter()
            if llama.llama_decode(ctx, batch) != 0:
                return
            steps.append(time.perf_counter() - started)
            alone.append(logits(0))
        llama.llama_memory_seq_rm(mem, seq, PROBE_CONTEXT, -1)
        costs.plain[1] = min(steps[1:])  # the first call of a context sets up its graph
        for rows in CALIBRATED_ROWS:
            best = None
            for _ in range(repeats):
                fill_batch(batch, tokens[:rows], range(PROBE_CONTEXT, PROBE_CONTEXT + rows), seq, True)
                started = time.perf_counter()
                rc = llama.llama_decode(ctx, batch)
                took = time.perf_counter() - started
                if rc == 0 and rows >= PROBE_ROWS:  # the same tokens at the same places, alone and in one pass
                    for j in range(PROBE_ROWS):
                        row = logits(j)
                        top = np.union1d(np.argpartition(alone[j], -8)[-8:], np.argpartition(row, -8)[-8:])
                        costs.rounding = max(costs.rounding, float(np.abs(alone[j][top] - row[top]).max()))
                llama.llama_memory_seq_rm(mem, seq, PROBE_CONTEXT, -1)
                if rc != 0:
                    return
                best = took if best is None else min(best, took)
            costs.passes[rows] = cast(float, best)  # timed: repeats >= 1
    finally:
        llama.llama_memory_seq_rm(mem, seq, -1, -1)
