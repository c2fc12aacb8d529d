"""Per-request pieces of decoding over llama.cpp's low-level API: the C sampler chain and
the token-to-bytes reader. The scheduler (:mod:`.scheduler`) drives the context.

Why the low-level API: ``Llama.create_completion`` samples in Python, which costs about
5 ms a token on Gemma's 262k vocabulary (≈ 81 % of the low-level speed here). llama.cpp's C
sampler chain and a reused one-token batch keep the Python work per token to a few ctypes
calls.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from localrun.types import Sampling

log = logging.getLogger(__name__)

PENALTY_LAST_N = 64


class Sampler(Protocol):
    """What drives one sequence: ``sample`` picks the token at a batch row (and accepts it), ``free``
    releases the native samplers. :class:`ChainSampler`, the grammar's and logprobs' wrappers."""

    def sample(self, ctx: Any, index: int) -> int: ...

    def free(self) -> None: ...


def build_sampler(llama: Any, sampling: Sampling, n_vocab: int) -> Any:
    """A C sampler chain for one request; the caller frees it with ``llama_sampler_free``.

    Logit biases first (so +100 forces a token even under greedy), then the penalties
    (repeat, frequency, presence: llama.cpp's one penalty sampler over the last 64 tokens),
    so they shape what the later stages see. Greedy when ``temperature <= 0``; otherwise
    top-k → typical → top-p → min-p → temperature → a seeded draw, the order llama.cpp's own
    tools use.
    """
    params = llama.llama_sampler_chain_default_params()
    params.no_perf = True
    chain = llama.llama_sampler_chain_init(params)
    add = llama.llama_sampler_chain_add
    if sampling.logit_bias:
        add(chain, logit_bias_sampler(llama, n_vocab, sampling.logit_bias))
    repeat = float(sampling.repeat_penalty or 1.0)
    freq, present = float(sampling.frequency_penalty or 0.0), float(sampling.presence_penalty or 0.0)
    if repeat != 1.0 or freq or present:
        add(chain, llama.llama_sampler_init_penalties(n_vocab, PENALTY_LAST_N, repeat, freq, present))
    if not sampling.temperature or sampling.temperature <= 0:
        add(chain, llama.llama_sampler_init_greedy())
        return chain
    if sampling.top_k and sampling.top_k > 0:
        add(chain, llama.llama_sampler_init_top_k(int(sampling.top_k)))
    if sampling.typical_p is not None and 0 < sampling.typical_p < 1:
        add(chain, llama.llama_sampler_init_typical(float(sampling.typical_p), 1))
    if sampling.top_p is not None and 0 < sampling.top_p < 1:
        add(chain, llama.llama_sampler_init_top_p(float(sampling.top_p), 1))
    if sampling.min_p and sampling.min_p > 0:
        add(chain, llama.llama_sampler_init_min_p(float(sampling.min_p), 1))
    add(chain, llama.llama_sampler_init_temp(float(sampling.temperature)))
    seed = llama.LLAMA_DEFAULT_SEED if sampling.seed is None else int(sampling.seed) & 0xFFFFFFFF
    add(chain, llama.llama_sampler_init_dist(seed))
    return chain


def logit_bias_sampler(llama: Any, n_vocab: int, biases: Sequence[tuple[int, float]]) -> Any:
    """llama.cpp's logit-bias stage. OpenAI's ±100 means "ban" / "force": the bias is added to
    the raw logit, and 100 already outweighs any logit a model produces."""
    arr = (llama.llama_logit_bias * len(biases))()
    for i, (token, bias) in enumerate(biases):
        arr[i].token = int(token)
        arr[i].bias = float("-inf") if bias <= -100 else float(bias)
    return llama.llama_sampler_init_logit_bias(n_vocab, len(biases), arr)


class EogGuard:
    """Keeps end-of-generation tokens from being sampled: always (``ignore_eos``) or for the
    first ``min_tokens`` tokens. It writes -inf into the context's logits of those tokens
    before the inner sampler reads them, so grammar, penalties and logprobs all see one
    consistent distribution; the inner chain's state is never rebuilt mid-answer."""

    __slots__ = ("_inner", "_get_logits", "_eog", "_left")
    _get_logits: Callable[[Any, int], Any]  # llama_get_logits_ith: a float pointer into the context's logits

    def __init__(self, llama: Any, inner: Sampler, eog_tokens: Sequence[int], until: int | None) -> None:
        self._inner, self._get_logits, self._eog = inner, llama.llama_get_logits_ith, tuple(eog_tokens)
        self._left = until  # None: for the whole answer

    def sample(self, ctx: Any, index: int) -> int:
        if self._left is None or self._left > 0:
            logits = self._get_logits(ctx, index)
            for token in self._eog:
                logits[token] = float("-inf")
            if self._left is not None:
                self._left -= 1
        return self._inner.sample(ctx, index)

    def free(self) -> None:
        self._inner.free()


class ChainSampler:
    """A request's C sampler chain behind the two calls the scheduler makes: ``sample``
    (which also accepts the token into the chain) and ``free``. Anything with these two
    methods can drive a sequence (a grammar-constrained sampler, say)."""

    __slots__ = ("_sample", "_free", "chain")
    _sample: Callable[[Any, Any, int], int]  # llama_sampler_sample(chain, ctx, index)
    _free: Callable[[Any], None]

    def __init__(self, llama: Any, chain: Any) -> None:
        self._sample, self._free, self.chain = llama.llama_sampler_sample, llama.llama_sampler_free, chain

    def sample(self, ctx: Any, index: int) -> int:
        return self._sample(self.chain, ctx, index)

    def free(self) -> None:
        if self.chain is not None:
            self._free(self.chain)
            self.chain = None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def token_piece_reader(llama: Any, vocab: Any) -> Callable[[int], bytes]:
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


def fill_batch(
    batch: Any,
    tokens: Sequence[int],
    positions: Sequence[int],
    seqs: Sequence[int] | int,
    logits: Sequence[bool] | bool,
) -> None:
    """Write rows into a ``llama_batch`` (one sequence id per row) and set its length.

    ``seqs`` and ``logits`` are per row, or one value for every row. The batch's array
    pointers are read once: each attribute access on the ctypes struct builds a new
    pointer object, which per row costs ~4x the writes themselves.
    """
    token, pos, n_seq_id, seq_id, out = batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits
    one_seq = isinstance(seqs, int)
    all_logits = isinstance(logits, bool)
    row_seqs, row_logits = cast("Sequence[int]", seqs), cast("Sequence[bool]", logits)  # read only when per row
    for i, tok in enumerate(tokens):
        token[i] = tok
        pos[i] = positions[i]
        n_seq_id[i] = 1
        seq_id[i][0] = seqs if one_seq else row_seqs[i]
        out[i] = logits if all_logits else row_logits[i]
    batch.n_tokens = len(tokens)
