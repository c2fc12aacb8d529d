"""The single-sequence decode loop over llama.cpp's low-level API.

Kept apart from the session on purpose: a batching scheduler (several sequences sharing
one context) will replace this class, while prompt building, text assembly and the
session's protocol stay as they are.

Why the low-level API: ``Llama.create_completion`` samples in Python, which costs about
5 ms a token on Gemma's 262k vocabulary (≈ 81 % of the low-level speed here). llama.cpp's C
sampler chain and a reused one-token batch keep the Python work per token to a few ctypes
calls.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence

from localrun.errors import LocalrunError
from localrun.types import Cancel, Sampling

log = logging.getLogger(__name__)

SEQ = 0  # the one sequence this decoder drives
PENALTY_LAST_N = 64


def build_sampler(llama, sampling: Sampling, n_vocab: int):
    """A C sampler chain for one request; the caller frees it with ``llama_sampler_free``.

    Greedy when ``temperature <= 0``; otherwise top-k → top-p → min-p → temperature → a
    seeded draw, the order llama.cpp's own tools use. A repeat penalty, when asked for,
    goes first so it shapes what the later stages see.
    """
    params = llama.llama_sampler_chain_default_params()
    params.no_perf = True
    chain = llama.llama_sampler_chain_init(params)
    add = llama.llama_sampler_chain_add
    if sampling.repeat_penalty and sampling.repeat_penalty != 1.0:
        add(chain, llama.llama_sampler_init_penalties(n_vocab, PENALTY_LAST_N, float(sampling.repeat_penalty), 0.0, 0.0))
    if not sampling.temperature or sampling.temperature <= 0:
        add(chain, llama.llama_sampler_init_greedy())
        return chain
    if sampling.top_k and sampling.top_k > 0:
        add(chain, llama.llama_sampler_init_top_k(int(sampling.top_k)))
    if sampling.top_p is not None and 0 < sampling.top_p < 1:
        add(chain, llama.llama_sampler_init_top_p(float(sampling.top_p), 1))
    if sampling.min_p and sampling.min_p > 0:
        add(chain, llama.llama_sampler_init_min_p(float(sampling.min_p), 1))
    add(chain, llama.llama_sampler_init_temp(float(sampling.temperature)))
    seed = llama.LLAMA_DEFAULT_SEED if sampling.seed is None else int(sampling.seed) & 0xFFFFFFFF
    add(chain, llama.llama_sampler_init_dist(seed))
    return chain


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SequenceDecoder:
    """Drives sequence 0 of one llama.cpp context: prefix reuse, chunked prefill, one
    token per step. ``tokens`` always lists exactly the tokens whose KV is in memory."""

    def __init__(self, llama, ctx, *, n_batch: int, n_swa: int) -> None:
        self._llama = llama
        self._ctx = ctx
        self._mem = llama.llama_get_memory(ctx)
        self._n_batch = max(1, n_batch)
        self._n_swa = n_swa
        self._batch = llama.llama_batch_init(self._n_batch, 0, 1)
        self.tokens: list[int] = []

    def reuse_prefix(self, prompt: Sequence[int]) -> int:
        """Keep the longest cached prefix of ``prompt`` (at least one token is left to
        evaluate, for its logits); drop the rest of the memory. Returns the kept length."""
        keep = min(common_prefix(self.tokens, prompt), len(prompt) - 1)
        if keep > 0 and self._n_swa > 0:
            # A sliding-window cache forgets old positions: reuse only if the window
            # before `keep` is still there (the rule llama-server applies).
            pos_min = self._llama.llama_memory_seq_pos_min(self._mem, SEQ)
            if pos_min < 0 or pos_min > max(0, keep - self._n_swa):
                keep = 0
        if keep <= 0 or not self._llama.llama_memory_seq_rm(self._mem, SEQ, keep, -1):
            self.clear()
            return 0
        del self.tokens[keep:]
        return keep

    def clear(self) -> None:
        self._llama.llama_memory_clear(self._mem, True)
        self.tokens.clear()

    def prefill(self, prompt: Sequence[int], cancel: Cancel) -> bool:
        """Evaluate ``prompt`` past the cached prefix in chunks of ``n_batch`` tokens,
        checking ``cancel`` between chunks. False if cancelled (the memory then holds the
        evaluated part, which the next request may reuse)."""
        start = len(self.tokens)
        if start >= len(prompt):
            raise ValueError("prefill needs at least one new token; call reuse_prefix first")
        b = self._batch
        while start < len(prompt):
            if cancel.is_set():
                return False
            end = min(start + self._n_batch, len(prompt))
            for i, tok in enumerate(prompt[start:end]):
                b.token[i] = tok
                b.pos[i] = start + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = SEQ
                b.logits[i] = 0
            b.logits[end - start - 1] = end == len(prompt)
            b.n_tokens = end - start
            self._decode(prompt[start:end])
            start = end
        return True

    def sample(self, sampler) -> int:
        """Sample (and accept) the next token from the last evaluated position."""
        return self._llama.llama_sampler_sample(sampler, self._ctx, -1)

    def advance(self, token: int) -> None:
        """Evaluate one generated token so the next one can be sampled."""
        b = self._batch
        b.token[0] = token
        b.pos[0] = len(self.tokens)
        b.n_seq_id[0] = 1
        b.seq_id[0][0] = SEQ
        b.logits[0] = 1
        b.n_tokens = 1
        self._decode((token,))

    def _decode(self, toks: Sequence[int]) -> None:
        rc = self._llama.llama_decode(self._ctx, self._batch)
        if rc != 0:
            self.clear()
            raise LocalrunError(
                f"llama_decode failed with code {rc} at position {len(self.tokens)}",
                hint="the context may be full or out of memory; retry with a shorter prompt",
            )
        self.tokens.extend(toks)

    def close(self) -> None:
        if self._batch is not None:
            self._llama.llama_batch_free(self._batch)
            self._batch = None


def token_piece_reader(llama, vocab):
    """``token -> bytes`` with a reused buffer and a per-token cache: a vocabulary's pieces
    never change, and a dict lookup is cheaper than a ctypes call."""
    buf = ctypes.create_string_buffer(256)
    cache: dict[int, bytes] = {}

    def piece(token: int) -> bytes:
        nonlocal buf
        hit = cache.get(token)
        if hit is not None:
            return hit
        n = llama.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
        out = buf.raw[:n]
        cache[token] = out
        return out

    return piece
