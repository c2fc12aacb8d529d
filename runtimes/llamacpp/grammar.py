"""Constrained output and log-probabilities for the llama.cpp runtime.

* :func:`json_schema_gbnf` and :func:`forced_call_gbnf` compile JSON Schemas with localrun's
  own converter (:func:`localrun.chat.constraints.schema_gbnf`: every keyword honoured or
  refused by name, every grammar bounded and checked, compiled grammars cached by schema) —
  the same functions the server ran on the request before it reached this worker, so what
  was checked there is what runs here.
* :func:`request_grammar` picks the one grammar a request needs: a forced tool call
  (:func:`localrun.chat.tools.forced_call`), else ``Sampling.json_schema`` (``{}`` → any JSON
  object), else a raw ``Sampling.grammar`` (checked again by :func:`localrun.chat.gbnf.check_gbnf`).
* :func:`sequence_sampler` wraps a sequence's C sampler chain with llama.cpp's grammar
  sampler (:class:`ConstrainedSampler`), so every token keeps the text valid and, once the
  grammar completes, only end-of-generation tokens remain.
* :class:`LogprobReader` reads one position's logits (``llama_get_logits_ith``) and turns
  them into a log-softmax with numpy: the chosen token's log-probability and the top n;
  :class:`LogprobSampler` does it after each pick of a sequence's sampler.
  These are the model's own probabilities, before temperature, top-k or a grammar mask,
  which is what OpenAI's ``logprobs`` reports. It costs one pass over the vocabulary
  (≈1 ms on Gemma's 262k), so it runs only when a request asks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from localrun.chat.constraints import schema_gbnf
from localrun.chat.gbnf import check_gbnf
from localrun.chat.schema_terms import gbnf_literal
from localrun.chat.tools import ForcedCall
from localrun.errors import UnsupportedFeature
from localrun.types import Sampling, logprob_entry

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.decode import ChainSampler, Sampler

log = logging.getLogger(__name__)

__all__ = ["CALL_PROP_ORDER", "forced_call_gbnf", "gbnf_literal", "json_schema_gbnf", "request_grammar"]

#: Properties written first, so a call reads name-then-arguments as models are trained to.
CALL_PROP_ORDER = ("name", "arguments", "parameters")


def json_schema_gbnf(schema: dict[str, Any], *, param: str = "response_format") -> str:
    """A GBNF grammar for JSON text valid against ``schema``; ``{}`` means any JSON object.

    Raises:
        UnsupportedFeature: a keyword the grammar cannot enforce or a limit passed, named by path.
    """
    return schema_gbnf(schema or {"type": "object"}, param=param)


def forced_call_gbnf(call: ForcedCall) -> str:
    """``prefix`` + one call object + ``suffix``, the shape :func:`localrun.chat.tools.forced_call` asks for."""
    body = schema_gbnf(call.schema, param="tool_choice", root="call", prop_order=CALL_PROP_ORDER)
    parts = [gbnf_literal(call.prefix)] if call.prefix else []
    parts.append("call")
    if call.suffix:
        parts.append(gbnf_literal(call.suffix))
    return f"root ::= {' '.join(parts)}\n{body}"


def request_grammar(sampling: Sampling, forced: ForcedCall | None) -> str | None:
    """The grammar a request's output must follow, or None.

    Raises:
        UnsupportedFeature: two constraints at once (a forced tool call and a JSON schema,
            or a schema and a raw grammar), or a schema that does not compile.
    """
    asked = [
        name
        for name, on in (
            ("tool_choice", forced is not None),
            ("response_format", sampling.json_schema is not None),
            ("grammar", sampling.grammar is not None),
        )
        if on
    ]
    if len(asked) > 1:
        raise UnsupportedFeature(
            f"{asked[0]!r} and {asked[1]!r} both constrain the output; only one can apply",
            param=asked[1],
            hint="drop one of them",
        )
    if forced is not None:
        return forced_call_gbnf(forced)
    if sampling.json_schema is not None:
        return json_schema_gbnf(sampling.json_schema)
    if sampling.grammar is not None:
        check_gbnf(sampling.grammar)
    return sampling.grammar


def grammar_sampler(llama: Any, vocab: Any, gbnf: str, *, root: str = "root") -> Any:
    """llama.cpp's grammar sampler for ``gbnf``; the caller adds it first to a chain (which then owns it).

    Raises:
        UnsupportedFeature: llama.cpp cannot parse the grammar.
    """
    sampler = llama.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
    if not sampler:
        raise UnsupportedFeature(
            "llama.cpp could not parse the grammar built for this request",
            param="grammar",
            hint="check the grammar or simplify the JSON schema",
        )
    return sampler


class ConstrainedSampler:
    """A sampler chain behind a grammar, sampled the way llama.cpp's own tools do it.

    Masking the whole vocabulary with the grammar every token is slow (measured on Gemma 3
    270M's 262k vocabulary, one thread: 18 ms a mask; 38 ms a token against 12 ms
    unconstrained). So the chain picks a token from the raw logits first and the grammar
    checks just that one. Only when it is invalid (about half the tokens of a JSON answer)
    does the grammar mask candidates: the ``shortlist`` highest logits first — exact when at
    least ``need`` of them are valid, since those are then the most likely valid tokens of the
    whole vocabulary and the chain keeps no more than ``need`` (greedy: 1; top-k: k) — else
    the whole vocabulary. Either way the chosen token is valid and is accepted into both.
    Greedy answers are token for token what masking everything gives; a sampled one draws
    again after a rejected pick, so a seed gives another (equally valid, equally
    reproducible) answer than a naive chain would. llama.cpp's own tools sample this way.
    Owns the chain it is given.

    Raises:
        UnsupportedFeature: llama.cpp cannot parse the grammar (the chain is freed).
    """

    def __init__(self, llama: Any, vocab: Any, gbnf: str, chain: Any, n_vocab: int, *, need: int | None = None) -> None:
        import ctypes

        import numpy as np

        try:
            self.grammar = grammar_sampler(llama, vocab, gbnf)
        except BaseException:
            llama.llama_sampler_free(chain)
            raise
        self._llama, self.chain, self._n, self._np = llama, chain, n_vocab, np
        self._need = need
        self._shortlist = min(n_vocab, max(64, 4 * need)) if need else 0
        self.full_masks = 0  # how often the whole vocabulary had to be masked (for tests and tuning)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        # A numpy array laid out as llama_token_data[] (int32 id, float logit, float p): one copy of the logits a fill.
        self._cells = np.zeros(n_vocab, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        data = ctypes.cast(self._cells.ctypes.data, ctypes.POINTER(llama.llama_token_data))
        self._all = llama.llama_token_data_array(data, n_vocab, -1, False)
        self._one_cell = (llama.llama_token_data * 1)()
        self._one = llama.llama_token_data_array(self._one_cell, 1, -1, False)
        self._byref = ctypes.byref

    def _logits(self, ctx: Any, index: int) -> Any:
        return self._np.ctypeslib.as_array(self._llama.llama_get_logits_ith(ctx, index), shape=(self._n,))

    def _fill(self, ctx: Any, index: int) -> None:
        cells = self._cells
        cells["id"] = self._ids  # samplers sort and truncate the array in place
        cells["logit"] = self._logits(ctx, index)
        cells["p"] = 0.0
        self._all.size, self._all.selected, self._all.sorted = self._n, -1, False

    def _fill_shortlist(self, ctx: Any, index: int) -> bool:
        """The ``shortlist`` best tokens, masked; True when at least ``need`` stay valid."""
        np, k = self._np, self._shortlist
        logits = self._logits(ctx, index)
        best = np.argpartition(logits, self._n - k)[self._n - k :]
        cells = self._cells
        cells["id"][:k] = best
        cells["logit"][:k] = logits[best]
        cells["p"][:k] = 0.0
        self._all.size, self._all.selected, self._all.sorted = k, -1, False
        self._llama.llama_sampler_apply(self.grammar, self._byref(self._all))
        size = self._all.size
        return int(np.count_nonzero(np.isfinite(cells["logit"][:size]))) >= cast(int, self._need)  # a shortlist has one

    def _pick(self) -> int:
        return int(self._all.data[self._all.selected].id)

    def sample(self, ctx: Any, index: int) -> int:
        llama, byref = self._llama, self._byref
        self._fill(ctx, index)
        llama.llama_sampler_apply(self.chain, byref(self._all))
        token = self._pick()
        cell = self._one_cell[0]
        cell.id, cell.logit, cell.p = token, 1.0, 0.0
        self._one.size, self._one.selected, self._one.sorted = 1, -1, False
        llama.llama_sampler_apply(self.grammar, byref(self._one))
        if cell.logit == float("-inf"):  # not valid here: mask, choose again
            if not (self._shortlist and self._fill_shortlist(ctx, index)):
                self.full_masks += 1
                self._fill(ctx, index)
                llama.llama_sampler_apply(self.grammar, byref(self._all))
            llama.llama_sampler_apply(self.chain, byref(self._all))
            token = self._pick()
        llama.llama_sampler_accept(self.grammar, token)
        llama.llama_sampler_accept(self.chain, token)
        return token

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows from its current state (a drafted
        token it forbids is cut before verification). Checked on a clone: the grammar itself
        only ever accepts what ``sample`` returns."""
        llama, byref = self._llama, self._byref
        probe = llama.llama_sampler_clone(self.grammar)
        cell = self._one_cell[0]
        try:
            for n, token in enumerate(tokens):
                cell.id, cell.logit, cell.p = token, 1.0, 0.0
                self._one.size, self._one.selected, self._one.sorted = 1, -1, False
                llama.llama_sampler_apply(probe, byref(self._one))
                if cell.logit == float("-inf"):
                    return n
                llama.llama_sampler_accept(probe, token)
            return len(tokens)
        finally:
            llama.llama_sampler_free(probe)

    def free(self) -> None:
        if self.chain is not None:
            self._llama.llama_sampler_free(self.grammar)
            self._llama.llama_sampler_free(self.chain)
            self.chain = self.grammar = None


def sequence_sampler(
    llama: Any, vocab: Any, chain: Any, gbnf: str | None, sampling: Sampling, n_vocab: int
) -> ChainSampler | ConstrainedSampler:
    """:class:`ConstrainedSampler` when there is a grammar, else a plain
    :class:`~localrun.runtimes.llamacpp.decode.ChainSampler`; owns ``chain``.

    ``chain`` must be what ``build_sampler`` makes of ``sampling``: the shortlist shortcut
    relies on its greedy or top-k stage, and is off under a penalty or a logit bias (which
    reorder the logits before top-k) or without top-k.
    """
    if not gbnf:
        from localrun.runtimes.llamacpp.decode import ChainSampler

        return ChainSampler(llama, chain)
    reordered = (
        (sampling.repeat_penalty and sampling.repeat_penalty != 1.0)
        or sampling.frequency_penalty
        or sampling.presence_penalty
        or sampling.logit_bias
    )
    if reordered:
        need = None
    elif not sampling.temperature or sampling.temperature <= 0:
        need = 1
    else:
        need = int(sampling.top_k) if sampling.top_k and sampling.top_k > 0 else None
    return ConstrainedSampler(llama, vocab, gbnf, chain, n_vocab, need=need)


class LogprobSampler:
    """Wraps a sequence's sampler: after each pick, the token's log-probability (and the top
    ``top_n``) is appended to ``entries``, a list the scheduler's job sends with its next
    chunk. End-of-generation tokens are not part of the answer and get no entry."""

    __slots__ = ("inner", "_reader", "_top_n", "entries", "_is_eog")

    def __init__(
        self,
        inner: Sampler,
        reader: LogprobReader,
        top_n: int,
        entries: list[dict[str, Any]],
        is_eog: Callable[[int], bool],
    ) -> None:
        self.inner, self._reader, self._top_n, self.entries, self._is_eog = inner, reader, top_n, entries, is_eog

    def sample(self, ctx: Any, index: int) -> int:
        token = self.inner.sample(ctx, index)
        if not self._is_eog(token):
            self.entries.append(self._reader.read(index, token, self._top_n))
        return token

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        check: Callable[[Sequence[int]], int] | None = getattr(self.inner, "valid_prefix", None)
        return len(tokens) if check is None else check(tokens)

    def free(self) -> None:
        self.inner.free()


class LogprobReader:
    """Log-probabilities at one evaluated position of a context.

    ``read(index, token, top_n)`` → ``{"token", "logprob", "bytes", "top_logprobs"}``, the
    entry :class:`localrun.types.Chunk` carries. ``index`` is the position's row in the last
    batch (``-1``: the last row). Call it after sampling and before the next decode.
    """

    def __init__(self, llama: Any, ctx: Any, n_vocab: int, piece_of: Callable[[int], bytes]) -> None:
        import numpy as np

        self._np = np
        self._llama, self._ctx, self._n_vocab, self._piece = llama, ctx, n_vocab, piece_of

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        return logprob_entry(self._piece(token), logprob)

    def _logits(self, index: int) -> Any:
        """The position's logits, a view of llama.cpp's buffer (no copy)."""
        ptr = self._llama.llama_get_logits_ith(self._ctx, index)
        if not ptr:
            raise UnsupportedFeature(
                f"no logits at batch row {index}", param="logprobs", hint="logprobs need the position's logits kept"
            )
        return self._np.ctypeslib.as_array(ptr, shape=(self._n_vocab,))

    def _log_normaliser(self, logits: Any) -> float:
        """log(sum(exp(logits))), shifted by the maximum so nothing overflows; summed in float64."""
        np = self._np
        top = float(logits.max())
        return top + math.log(float(np.exp(logits - top, dtype=np.float64).sum()))

    def log_softmax(self, index: int) -> Any:
        """The whole vector (for checks; ``read`` takes only the entries it needs)."""
        logits = self._logits(index)
        return logits.astype(self._np.float64) - self._log_normaliser(logits)

    def read(self, index: int, token: int, top_n: int) -> dict[str, Any]:
        np = self._np
        logits = self._logits(index)
        norm = self._log_normaliser(logits)
        entry = self._entry(token, float(logits[token]) - norm)
        alts: list[dict[str, Any]] = []
        if top_n > 0:
            n = min(int(top_n), self._n_vocab)
            best = np.argpartition(logits, self._n_vocab - n)[self._n_vocab - n :]  # the n largest, unordered
            best = best[np.argsort(-logits[best], kind="stable")]
            alts = [self._entry(int(t), float(logits[t]) - norm) for t in best]
        entry["top_logprobs"] = alts
        return entry
