"""Constrained output and log-probabilities for the llama.cpp runtime.

Only ever used inside the worker: the JSON Schema converter is llama-cpp-python's own
(``llama_cpp.llama_grammar.SchemaConverter``, a translation of llama.cpp's
``json-schema-to-grammar``), and importing ``llama_cpp`` loads the native library.

* :func:`request_grammar` picks the one grammar a request needs: a forced tool call
  (:func:`localrun.tools.forced_call`), else ``Sampling.json_schema`` (``{}`` → any JSON
  object), else a raw ``Sampling.grammar``.
* :func:`grammar_sampler` builds llama.cpp's C grammar sampler, to go first in a
  sequence's sampler chain, so every later stage only sees tokens that keep the text valid.
  After the grammar completes, only end-of-generation tokens remain.
* :class:`LogprobReader` reads one position's logits (``llama_get_logits_ith``) and turns
  them into a log-softmax with numpy: the chosen token's log-probability and the top n.
  These are the model's own probabilities, before temperature, top-k or a grammar mask,
  which is what OpenAI's ``logprobs`` reports. It costs one pass over the vocabulary
  (≈1 ms on Gemma's 262k), so it runs only when a request asks.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any

from localrun.errors import UnsupportedFeature
from localrun.tools import ForcedCall
from localrun.types import Sampling

log = logging.getLogger(__name__)

#: Properties written first, so a call reads name-then-arguments as models are trained to.
CALL_PROP_ORDER = ("name", "arguments", "parameters")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    return '"' + "".join(_ESCAPES.get(ch, ch) for ch in text) + '"'


def _converter(prop_order: tuple[str, ...] = ()):
    from llama_cpp.llama_grammar import SchemaConverter

    return SchemaConverter(prop_order={k: i for i, k in enumerate(prop_order)}, allow_fetch=False,
                           dotall=False, raw_pattern=False)


def _compile(schema: dict[str, Any], rule: str, prop_order: tuple[str, ...], param: str):
    if not isinstance(schema, dict):
        raise UnsupportedFeature(f"the JSON schema in {param!r} must be an object, not {type(schema).__name__}",
                                 param=param, hint="send a JSON Schema object")
    conv = _converter(prop_order)
    try:
        resolved = conv.resolve_refs(json.loads(json.dumps(schema)), "request")
        conv.visit(resolved, rule)
    except Exception as exc:  # noqa: BLE001 - third-party code over untrusted input: any failure is a bad schema
        log.debug("schema conversion failed", exc_info=True)
        raise UnsupportedFeature(f"the JSON schema in {param!r} cannot be compiled to a grammar: {exc}",
                                 param=param, hint="simplify the schema (local $refs, no remote ones)") from exc
    return conv


def json_schema_gbnf(schema: dict[str, Any], *, param: str = "response_format") -> str:
    """A GBNF grammar for JSON text valid against ``schema``; ``{}`` means any JSON object."""
    return _compile(schema or {"type": "object"}, "", (), param).format_grammar()


def forced_call_gbnf(call: ForcedCall) -> str:
    """``prefix`` + one call object + ``suffix``, the shape :func:`localrun.tools.forced_call` asks for."""
    conv = _compile(call.schema, "call", CALL_PROP_ORDER, "tool_choice")
    body = conv.format_grammar()
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
    asked = [name for name, on in (("tool_choice", forced is not None), ("response_format", sampling.json_schema is not None),
                                   ("grammar", sampling.grammar is not None)) if on]
    if len(asked) > 1:
        raise UnsupportedFeature(f"{asked[0]!r} and {asked[1]!r} both constrain the output; only one can apply",
                                 param=asked[1], hint="drop one of them")
    if forced is not None:
        return forced_call_gbnf(forced)
    if sampling.json_schema is not None:
        return json_schema_gbnf(sampling.json_schema)
    return sampling.grammar


def grammar_sampler(llama, vocab, gbnf: str, *, root: str = "root"):
    """llama.cpp's grammar sampler for ``gbnf``; the caller adds it first to a chain (which then owns it).

    Raises:
        UnsupportedFeature: llama.cpp cannot parse the grammar.
    """
    sampler = llama.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
    if not sampler:
        raise UnsupportedFeature("llama.cpp could not parse the grammar built for this request",
                                 param="grammar", hint="check the grammar or simplify the JSON schema")
    return sampler


class LogprobReader:
    """Log-probabilities at one evaluated position of a context.

    ``read(index, token, top_n)`` → ``{"token", "logprob", "bytes", "top_logprobs"}``, the
    entry :class:`localrun.types.Chunk` carries. ``index`` is the position's row in the last
    batch (``-1``: the last row). Call it after sampling and before the next decode.
    """

    def __init__(self, llama, ctx, n_vocab: int, piece_of: Callable[[int], bytes]) -> None:
        import numpy as np

        self._np = np
        self._llama, self._ctx, self._n_vocab, self._piece = llama, ctx, n_vocab, piece_of

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        raw = self._piece(token)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    def log_softmax(self, index: int):
        np = self._np
        ptr = self._llama.llama_get_logits_ith(self._ctx, index)
        if not ptr:
            raise UnsupportedFeature(f"no logits at batch row {index}", param="logprobs",
                                     hint="logprobs need the position's logits kept")
        logits = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).astype(np.float64)
        top = logits.max()
        return logits - (top + math.log(float(np.exp(logits - top).sum())))

    def read(self, index: int, token: int, top_n: int) -> dict[str, Any]:
        np = self._np
        lp = self.log_softmax(index)
        entry = self._entry(token, float(lp[token]))
        alts: list[dict[str, Any]] = []
        if top_n > 0:
            n = min(int(top_n), self._n_vocab)
            best = np.argpartition(-lp, n - 1)[:n]
            best = best[np.argsort(-lp[best], kind="stable")]
            alts = [self._entry(int(t), float(lp[t])) for t in best]
        entry["top_logprobs"] = alts
        return entry
