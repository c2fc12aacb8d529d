"""Draft models: a second, smaller GGUF that proposes the next tokens of every running
sequence, for the scheduler to verify in the target model (speculative decoding).

The draft lives in the target's worker beside it, with its own context: one KV stream per
sequence (seq id = the target's slot), so each sequence's draft KV follows what the target
holds. :meth:`DraftModel.propose` brings every wanted sequence's KV in line with its tokens
(the common prefix stays, the rest is removed and the missing tail decoded), then drafts k
greedy tokens with k decode calls batched across the sequences, one row per sequence per
call: with one stream per sequence llama.cpp cuts a batch into micro-batches of equal rows
per sequence, so one row each is one pass for all of them.

Why greedy by numpy's argmax over the logits llama.cpp returns, not a greedy
``llama_sampler``: one ``argmax(axis=1)`` reads every sequence's row of a step at once,
and llama.cpp's sampler would copy the whole vocabulary into a candidate array per row
(3 MB a row for Gemma's 262k tokens). A draft only needs to be cheap and deterministic:
what the target keeps is decided by the target's own verification.

Vocabulary compatibility follows llama.cpp's own rules (common/speculative.cpp): the same
vocabulary type, the same add-BOS flag and BOS id when BOS is added, the same for EOS,
sizes within 128 tokens, and the same text for every token id from 5 up to the smaller
size. A draft token the target's vocabulary lacks ends that draft.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from localrun.errors import ConfigError, InvalidModelFile, WontFit
from localrun.runtimes.llamacpp.decode import common_prefix, fill_batch
from localrun.runtimes.llamacpp.native_log import NATIVE_LOG

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.slots import Layout
    from localrun.types import Plan

log = logging.getLogger(__name__)

#: llama.cpp's limits for a compatible draft (common/speculative.cpp).
MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5
_FIX = "use a draft model from the target's family (the same tokenizer), or turn drafting off (--speculative ngram/off)"


@dataclass(frozen=True)
class VocabFacts:
    """What llama.cpp compares between a target's and a draft's vocabulary."""

    kind: int  # llama_vocab_type
    add_bos: bool
    bos: int
    add_eos: bool
    eos: int
    n_tokens: int
    text: Callable[[int], bytes]  # a token's text as stored in the vocabulary

    @classmethod
    def of(cls, llama: Any, model: Any) -> VocabFacts:
        vocab = llama.llama_model_get_vocab(model)
        return cls(
            kind=int(llama.llama_vocab_type(vocab)),
            add_bos=bool(llama.llama_vocab_get_add_bos(vocab)),
            bos=int(llama.llama_vocab_bos(vocab)),
            add_eos=bool(llama.llama_vocab_get_add_eos(vocab)),
            eos=int(llama.llama_vocab_eos(vocab)),
            n_tokens=int(llama.llama_vocab_n_tokens(vocab)),
            text=lambda token: llama.llama_vocab_get_text(vocab, token) or b"",
        )


def vocab_difference(target: VocabFacts, draft: VocabFacts) -> str | None:
    """What makes ``draft`` unfit to draft for ``target`` (llama.cpp's rules), or None."""
    if target.kind != draft.kind:
        return f"vocabulary type {draft.kind} vs the target's {target.kind}"
    for name, add_t, id_t, add_d, id_d in (
        ("BOS", target.add_bos, target.bos, draft.add_bos, draft.bos),
        ("EOS", target.add_eos, target.eos, draft.add_eos, draft.eos),
    ):
        if add_t != add_d:
            return f"add-{name} is {add_d} vs the target's {add_t}"
        if add_t and id_t != id_d:
            return f"{name} token id {id_d} vs the target's {id_t}"
    if abs(target.n_tokens - draft.n_tokens) > MAX_VOCAB_SIZE_DIFFERENCE:
        return (
            f"{draft.n_tokens} tokens vs the target's {target.n_tokens} (more than {MAX_VOCAB_SIZE_DIFFERENCE} apart)"
        )
    for token in range(FIRST_CHECKED_TOKEN, min(target.n_tokens, draft.n_tokens)):
        mine, theirs = draft.text(token), target.text(token)
        if mine != theirs:
            return f"token {token} is {_shown(mine)} vs the target's {_shown(theirs)}"
    return None


def _shown(text: bytes) -> str:
    return repr(text.decode("utf-8", errors="replace")[:40])


class _Want:
    __slots__ = ("seq", "tokens", "k", "drafts", "done")
    drafts: list[int]

    def __init__(self, seq: int, tokens: list[int], k: int) -> None:
        self.seq, self.tokens, self.k, self.drafts, self.done = seq, tokens, k, [], False


class DraftModel:
    """A draft GGUF loaded for ``n_seq`` sequences of ``n_ctx_per_seq`` tokens each.

    Not thread-safe: one thread (the scheduler's) calls :meth:`propose` and :meth:`forget`;
    :meth:`close` after that thread stopped. ``seconds`` is the wall time spent in
    :meth:`propose` so far (the cost model reads it). ``flash_attn_type`` should be what the
    target's context uses (a ``LLAMA_FLASH_ATTN_TYPE_*`` value; None: llama.cpp's default).
    """

    def __init__(
        self,
        llama: Any,
        path: str,
        *,
        target_model: Any,
        n_seq: int,
        n_ctx_per_seq: int,
        n_threads: int,
        n_batch: int = 512,
        flash_attn_type: int | None = None,
        n_gpu_layers: int = 0,
        target_path: str | None = None,
    ) -> None:
        if n_seq < 1 or n_ctx_per_seq < 2 or n_batch < 1:
            raise ConfigError(
                f"draft model for {n_seq} sequences of {n_ctx_per_seq} tokens, batch {n_batch}",
                param="draft",
                hint="use at least 1 sequence of 2 tokens and a positive batch",
            )
        self._llama = llama
        self.path = str(path)
        self.n_seq = int(n_seq)
        self.seconds = 0.0
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self._held: dict[int, list[int]] = {}  # the tokens each sequence's draft KV holds, in order
        self._n_batch = max(int(n_batch), self.n_seq)  # a draft step is one row per sequence
        try:
            self._model = self._load(n_gpu_layers)
            self._check_vocab(target_model, target_path or "the target model")
            self._ctx = self._context(n_ctx_per_seq, n_threads, flash_attn_type)
            self._batch = llama.llama_batch_init(self._n_batch, 0, 1)
        except BaseException:
            self.close()
            raise
        self._mem = llama.llama_get_memory(self._ctx)
        self._vocab = llama.llama_model_get_vocab(self._model)
        self._n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        self._target_n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(target_model))
        per_seq = llama.llama_n_ctx_seq(self._ctx)
        self.n_ctx_per_seq = min(int(n_ctx_per_seq), int(per_seq))
        self._eog: dict[int, bool] = {}

    def _load(self, n_gpu_layers: int) -> Any:
        llama = self._llama
        if not os.path.isfile(self.path):
            raise InvalidModelFile(
                f"draft model file not found: {self.path}",
                param="draft",
                hint="give the path of a GGUF file, or pull the draft model first",
            )
        mp = llama.llama_model_default_params()
        mp.n_gpu_layers = int(n_gpu_layers)
        model = llama.llama_model_load_from_file(os.fsencode(self.path), mp)
        if not model:
            raise InvalidModelFile(
                f"llama.cpp could not load the draft model {self.path}" + _native_why(),
                param="draft",
                hint="give a GGUF model file (not corrupt, an architecture this llama.cpp knows)",
            )
        return model

    def _check_vocab(self, target_model: Any, target_path: str) -> None:
        llama = self._llama
        why = vocab_difference(VocabFacts.of(llama, target_model), VocabFacts.of(llama, self._model))
        if why:
            raise ConfigError(
                f"the draft model {self.path} cannot draft for {target_path}: its vocabulary differs ({why})",
                param="draft",
                hint=_FIX,
            )

    def _context(self, n_ctx_per_seq: int, n_threads: int, flash_attn_type: int | None) -> Any:
        llama = self._llama
        cp = llama.llama_context_default_params()
        cp.n_ctx = self.n_seq * int(n_ctx_per_seq)
        cp.n_seq_max = self.n_seq
        cp.kv_unified = False  # one stream per sequence, as the scheduler's context
        cp.n_batch = self._n_batch
        cp.n_ubatch = min(self._n_batch, 512)
        cp.n_threads = cp.n_threads_batch = max(1, int(n_threads))
        if flash_attn_type is not None:
            cp.flash_attn_type = int(flash_attn_type)
        ctx = llama.llama_init_from_model(self._model, cp)
        if not ctx:
            raise WontFit(
                f"llama.cpp could not create the draft model's {cp.n_ctx}-token context "
                f"({self.n_seq} sequences) for {self.path}" + _native_why(),
                param="draft",
                hint="lower the context length or the slots, or use a smaller draft model",
            )
        return ctx

    # --- drafting ---------------------------------------------------------------------------

    def propose(self, wants: list[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        """Up to k greedy draft tokens per ``(seq, tokens, k)``, continuing ``tokens``.

        Fewer where the sequence's context would overflow, or where the draft reaches an
        end-of-generation token (never proposed) or one outside the target's vocabulary.
        A failed llama.cpp call gives no (further) drafts and forgets the sequences
        concerned: drafting is an optimisation, never an error.
        """
        started = time.perf_counter()
        try:
            return self._propose(wants)
        finally:
            self.seconds += time.perf_counter() - started

    def _propose(self, wants: list[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        if self._ctx is None:
            raise RuntimeError("the draft model is closed")
        plans: list[_Want] = []
        seen: set[int] = set()
        for seq, tokens, k in wants:
            if not 0 <= seq < self.n_seq or seq in seen:
                raise ValueError(f"draft wanted for sequence {seq}: not in 0..{self.n_seq - 1}, or twice")
            seen.add(seq)
            # The KV holds the tokens and k-1 drafts (the last draft is never decoded).
            plans.append(_Want(seq, list(tokens), min(int(k), self.n_ctx_per_seq + 1 - len(tokens))))
        live = [p for p in plans if p.k > 0 and p.tokens]
        if live:
            self._catch_up(live)
            while True:
                live = [p for p in live if not p.done and len(p.drafts) < p.k]
                if not live:
                    break
                self._step(live)
        return [p.drafts for p in plans]

    def _catch_up(self, plans: list[_Want]) -> None:
        """Bring each sequence's KV to its tokens, and take each first draft from the logits
        of its last token (decoded again when the KV already held it)."""
        rows: list[tuple[int, int, int]] = []  # (seq, token, pos)
        last_rows: set[int] = set()
        for p in plans:
            held = self._held.get(p.seq, [])
            keep = min(shared_prefix(held, p.tokens), len(p.tokens) - 1)
            if keep < len(held) and not self._llama.llama_memory_seq_rm(self._mem, p.seq, keep, -1):
                # A partial removal can fail (a sliding-window cache): start the sequence over.
                self._llama.llama_memory_seq_rm(self._mem, p.seq, -1, -1)
                keep = 0
            self._held[p.seq] = p.tokens[:keep]
            rows.extend((p.seq, p.tokens[pos], pos) for pos in range(keep, len(p.tokens)))
            last_rows.add(len(rows) - 1)
        by_seq = {p.seq: p for p in plans}
        for start in range(0, len(rows), self._n_batch):
            chunk = rows[start : start + self._n_batch]
            outputs = [start + i in last_rows for i in range(len(chunk))]
            if not self._decode(chunk, outputs, list(by_seq.values())):
                return
            for seq, token, _ in chunk:
                self._held[seq].append(token)
            ended = [chunk[i][0] for i, out in enumerate(outputs) if out]
            for seq, token in zip(ended, self._argmax(len(ended))):
                self._take(by_seq[seq], token)

    def _step(self, plans: list[_Want]) -> None:
        """One batched decode of every sequence's last draft, one row each."""
        rows = [(p.seq, p.drafts[-1], len(self._held[p.seq])) for p in plans]
        if not self._decode(rows, True, plans):
            return
        for p, token in zip(plans, self._argmax(len(plans))):
            self._held[p.seq].append(p.drafts[-1])
            self._take(p, token)

    def _take(self, p: _Want, token: int) -> None:
        if token >= self._target_n_vocab or self._is_eog(token):
            p.done = True
        else:
            p.drafts.append(token)

    def _decode(self, rows: Sequence[tuple[int, int, int]], outputs: Sequence[bool] | bool, plans: list[_Want]) -> bool:
        fill_batch(self._batch, [r[1] for r in rows], [r[2] for r in rows], [r[0] for r in rows], outputs)
        rc = self._llama.llama_decode(self._ctx, self._batch)
        if rc == 0:
            return True
        log.warning("draft model %s: llama_decode returned %d; no drafts this step", self.path, rc)
        for p in plans:  # what their KV holds is unknown now
            p.done = True
            self.forget(p.seq)
        return False

    def _argmax(self, n_rows: int) -> list[int]:
        import numpy as np

        # llama.h: the rows asked for are stored contiguously, in batch order.
        logits = np.ctypeslib.as_array(self._llama.llama_get_logits(self._ctx), shape=(n_rows, self._n_vocab))
        return cast("list[int]", logits.argmax(axis=1).tolist())

    def _is_eog(self, token: int) -> bool:
        hit = self._eog.get(token)
        if hit is None:
            hit = self._eog[token] = bool(self._llama.llama_vocab_is_eog(self._vocab, token))
        return hit

    # --- lifetime -----------------------------------------------------------------------------

    def forget(self, seq: int) -> None:
        """Drop what the draft holds of ``seq`` (its request ended, or its slot was reused)."""
        self._held.pop(seq, None)
        if self._ctx is not None:
            self._llama.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def close(self) -> None:
        """Free the batch, the context and the model; safe to call twice."""
        llama = self._llama
        if self._batch is not None:
            llama.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            llama.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            llama.llama_model_free(self._model)
            self._model = None
        self._held.clear()


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share, by halving slice comparisons: they run
    in C, where :func:`~.decode.common_prefix`'s loop costs ~50 µs per 1,000 tokens, per
    sequence and draft step, in Python."""
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; the first difference, if any, is before hi
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo + common_prefix(a[lo:hi], b[lo:hi])


def _native_why() -> str:
    """llama.cpp's last warnings, when the session's log hook collected them."""
    why = NATIVE_LOG.take_recent()
    return f": {why}" if why else ""


def load_drafter(
    llama: Any, target_model: Any, plan: Plan, layout: Layout, target_path: str, *, flash_attn_type: int | None
) -> DraftModel:
    """The draft model of ``plan.options["draft"]``, in the target's worker beside it: one KV
    stream per slot of ``layout``, the target's threads, GPU layers and flash attention."""
    return DraftModel(
        llama,
        str(plan.options["draft"]),
        target_model=target_model,
        n_seq=layout.n_slots,
        n_ctx_per_seq=layout.slot_ctx,
        n_threads=max(1, int(plan.n_threads)),
        flash_attn_type=flash_attn_type,
        n_gpu_layers=int(plan.n_gpu_layers),
        target_path=target_path,
    )
