"""The scheduler's speculative steps: draft, verify in one pass, keep the agreeing prefix.

A mixin of :class:`~.scheduler.Scheduler` (its own module only to keep the scheduler
readable); the drafts and the policy that decides when they pay are :mod:`.speculative`.

Why each verification is its own ``llama_decode`` call: with one KV stream per sequence,
llama.cpp splits a batch into micro-batches with the same number of rows per sequence, so a
sequence's k+1 rows beside other sequences' single rows would cost k+1 passes. Why at most
7 rows (``MAX_DRAFT`` + 1): that is the range the scheduler's batch-invariance rule covers.
Measured here (llama-cpp-python 0.3.36, AVX2), Gemma 3 270M Q4_K_M with flash attention:
a 2-7 row pass gives one-row steps' logits bit for bit while the KV view is under 512
cells (~256 tokens); beyond, and without flash attention, it rounds differently, as a
batched step does (docs/architecture.md, "Speculative decoding"). :func:`verification_is_exact`
checks this at load, and ``auto`` drafts in a batch-invariant layout only where it holds.
"""

from __future__ import annotations

import logging
import time

from localrun.runtimes.llamacpp.decode import fill_batch
from localrun.runtimes.llamacpp.speculative import MAX_DRAFT

log = logging.getLogger(__name__)

PROBE_CONTEXT = 48


class SpeculativeSteps:
    """Needs from the scheduler: ``layout``, ``costs``, ``spec_totals``, ``_batch``,
    ``_ctx``, ``_kv``, ``_is_eog``, ``_decode_rc``, ``_fail`` and ``_emit``."""

    def _speculate(self, jobs: list) -> list:
        """Verify a draft for every sequence whose draft pays, each in its own call (a
        sequence's rows must not share a micro-batch with other sequences', see the module
        docstring); return the jobs left to decode plainly."""
        rows_now = min(len(jobs), self.layout.decode_rows)
        plain = []
        for job in jobs:
            draft = self._draft_for(job, rows_now)
            if not (draft and self._verify(job, draft)) and job.slot is not None:
                plain.append(job)
        return plain

    def _draft_for(self, job, rows_now: int) -> list[int]:
        spec = job.spec
        if spec is None:
            return []
        # k+1 rows at positions base..base+k must fit the slot, and k+1 tokens the request's limit.
        room = min(MAX_DRAFT, self.layout.slot_ctx - 1 - len(job.slot.tokens), job.limit - job.produced - 1)
        if room <= 0:
            return []
        proposal = spec.index.propose(room)
        check = getattr(job.sampler, "valid_prefix", None)
        if proposal and check is not None:
            proposal = proposal[:check(proposal)]  # a token the grammar forbids would be rejected anyway
        if not proposal:
            return []
        decision = spec.policy.choose(len(proposal), self.costs, rows_now)
        if decision.k == 0:
            spec.policy.shadow(proposal)
        return proposal[:decision.k]

    def _verify(self, job, draft: list[int]) -> bool:
        """One pass over the pending token and ``draft``; keep the agreeing prefix and the
        model's own next token. False when the KV cache has no room for the extra rows now
        (the job then decodes plainly)."""
        slot, ctx = job.slot, self._ctx
        base, rows = len(slot.tokens), [job.pending, *draft]
        fill_batch(self._batch, rows, range(base, base + len(rows)), slot.seq, True)
        started = time.perf_counter()
        rc = self._decode_rc()
        if rc == 1:
            return False
        if rc != 0:
            self._fail([job], rc)
            return True
        self.costs.observe_verify(len(rows), time.perf_counter() - started)
        entries = job.logprobs
        start = len(entries) if entries is not None else 0
        tokens, marks, kept = [], [], 0
        for i in range(len(rows)):  # in order, stopping at the first disagreement: the sampler sees what plain decoding shows it
            token = job.sampler.sample(ctx, i)
            tokens.append(token)
            marks.append(len(entries) if entries is not None else 0)
            if i == len(draft) or token != draft[i]:
                break
            kept += 1
            if self._is_eog(token):
                break
        if kept < len(draft):
            self._kv.truncate(slot.seq, base + 1 + kept)  # the rejected drafts leave the KV cache
        slot.tokens.extend(rows[:1 + kept])
        job.spec.verified(len(draft), kept)
        self.spec_totals.add(len(draft), kept)
        held = entries[start:] if entries is not None else []
        if entries is not None:
            del entries[start:]
        done = start
        for token, mark in zip(tokens, marks):
            if entries is not None:  # a token's logprob entries go out with it, none for tokens never emitted
                entries.extend(held[done - start:mark - start])
                done = mark
            self._emit(job, token)
            if job.slot is None:
                break
        return True


def verification_is_exact(llama, ctx, batch, *, rows: int = MAX_DRAFT + 1) -> bool:
    """Whether a pass of ``rows`` rows of one sequence gives, bit for bit, the logits that
    one-row steps give, on this build, model and context settings (checked at load on
    sequence 0, which is left empty). Measured here: yes for Gemma 3 270M Q4_K_M with
    flash attention; no without it (logits differ by up to 1.5), nor for F32 weights
    (tinyBLAS takes 2+ rows, ~1e-7)."""
    import numpy as np

    n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(llama.llama_get_model(ctx)))
    mem = llama.llama_get_memory(ctx)
    # A short context first: some kernels differ only once there are a few dozen cells to attend to.
    context = [(7 + 13 * i) % n_vocab for i in range(PROBE_CONTEXT)]
    tokens = [(11 + 17 * i) % n_vocab for i in range(rows)]

    def logits(row: int):
        return np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, row), shape=(n_vocab,)).copy()

    try:
        for start in range(0, PROBE_CONTEXT, rows):  # chunks the batch and the context's n_batch always hold
            chunk = context[start:start + rows]
            fill_batch(batch, chunk, range(start, start + len(chunk)), 0, False)
            if llama.llama_decode(ctx, batch) != 0:
                return False
        alone = []
        for pos, token in enumerate(tokens, PROBE_CONTEXT):
            fill_batch(batch, [token], [pos], 0, True)
            if llama.llama_decode(ctx, batch) != 0:
                return False
            alone.append(logits(0))
        llama.llama_memory_seq_rm(mem, 0, PROBE_CONTEXT, -1)
        fill_batch(batch, tokens, range(PROBE_CONTEXT, PROBE_CONTEXT + rows), 0, True)
        if llama.llama_decode(ctx, batch) != 0:
            return False
        return all(np.array_equal(logits(i), alone[i]) for i in range(rows))
    finally:
        llama.llama_memory_seq_rm(mem, 0, -1, -1)
