"""Embeddings from a GGUF model, on a context of its own.

A model's GGUF says it is an embedding model by carrying ``<arch>.pooling_type`` (BERT,
nomic-bert, Qwen3-Embedding…); ``plan.options["embedding"]`` forces the answer either way
(``True`` on a decoder gives mean-pooled hidden states, handy for tests and small setups),
and ``plan.options["pooling"]`` (``mean``/``cls``/``last``/``none``/``rank``, the ``--pooling``
flag) overrides the GGUF's pooling, so a generative model such as Gemma can serve
embeddings; ``none`` keeps one vector per token (llama-server's native ``/embeddings``),
``rank`` makes a reranker's relevance score the output (``/rerank``).

The embedding context is separate from the generation one (``embeddings=True`` changes
what a decode computes) and is created on the first request, so a chat model that is
never asked for vectors pays nothing. Each text is evaluated alone in one batch (an
encoder needs the whole input in one micro-batch), pooled by llama.cpp — the model's own
pooling, or mean when the model names none — and L2-normalised, so a dot product is the
cosine similarity. Texts longer than the context are refused, never truncated. The
evaluation itself runs on the thread given as ``call`` (the session's scheduler thread:
:mod:`.calls` says why a second computing thread slows generation).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from localrun.errors import ContextOverflow, LocalrunError, UnsupportedFeature, WontFit
from localrun.runtimes.llamacpp.decode import fill_batch
from localrun.types import Plan

log = logging.getLogger(__name__)

#: Tokens one input may have when neither the plan nor the model says.
DEFAULT_EMBED_CTX = 2048
#: The embedding context a plan's own context is capped at unless ``options.embed_ctx`` asks for more: it runs
#: one batch of its whole size (n_ubatch = n_ctx), so a decoder's 32k context would need a compute buffer that
#: llama.cpp cannot allocate, and no embedding input needs that much.
MAX_AUTO_EMBED_CTX = 8192


def meta_str(llama: Any, model: Any, key: str) -> str | None:
    """A GGUF metadata value as text, or None when the key is absent."""
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama.llama_model_meta_val_str(model, key.encode(), buf, size)
        if n < 0:
            return None
        if n < size:
            return buf.value.decode("utf-8", errors="replace")
        size = n + 1


def model_pooling(llama: Any, model: Any) -> int | None:
    """The pooling type the GGUF declares (``<arch>.pooling_type``), or None."""
    arch = meta_str(llama, model, "general.architecture")
    value = meta_str(llama, model, f"{arch}.pooling_type") if arch else None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


#: ``plan.options["pooling"]`` values (the ``--pooling`` flag), as llama.cpp's pooling types.
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}


def pooling_override(plan: Plan) -> int | None:
    """The plan's pooling override as a llama.cpp pooling type, or None.

    Raises:
        UnsupportedFeature: an unknown name (the message lists the right ones).
    """
    name = plan.options.get("pooling")
    if name is None:
        return None
    if name not in POOLING:
        raise UnsupportedFeature(f"unknown pooling {name!r}", param="pooling", hint="use one of: " + ", ".join(POOLING))
    return POOLING[name]


def effective_pooling(llama: Any, model: Any, plan: Plan) -> int | None:
    """The pooling embeddings use: the plan's override, else the GGUF's, else None (a decoder)."""
    forced = pooling_override(plan)
    return forced if forced is not None else model_pooling(llama, model)


def embeddings_wanted(llama: Any, model: Any, plan: Plan) -> bool:
    """Whether this session declares the ``embeddings`` capability: a pooling override or the
    ``embedding`` option says so, else the GGUF's pooling does (not none, not rank)."""
    if pooling_override(plan) is not None:
        return True
    forced = plan.options.get("embedding")
    if forced is not None:
        return bool(forced)
    pooling = model_pooling(llama, model)
    return pooling is not None and pooling not in (llama.LLAMA_POOLING_TYPE_NONE, POOLING["rank"])


class Embedder:
    """Pooled, normalised embeddings on its own context. Thread-safe (one text at a time)."""

    def __init__(
        self,
        llama: Any,
        model: Any,
        plan: Plan,
        *,
        tokenize: Callable[[str], list[int]],
        pooling: int | None = None,
        call: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        self._llama, self._model, self._tokenize = llama, model, tokenize
        self._call = call or (lambda fn: fn())
        self._lock = threading.Lock()
        self.n_embd = int(llama.llama_model_n_embd(model))
        self.n_cls_out = (
            max(1, int(llama.llama_model_n_cls_out(model))) if hasattr(llama, "llama_model_n_cls_out") else 1
        )
        train = int(llama.llama_model_n_ctx_train(model)) or DEFAULT_EMBED_CTX
        asked = plan.options.get("embed_ctx")
        want = int(asked) if asked else min(plan.n_ctx or DEFAULT_EMBED_CTX, MAX_AUTO_EMBED_CTX)
        self.n_ctx = max(8, min(want, train))
        pooling = effective_pooling(llama, model, plan) if pooling is None else pooling
        # A decoder without an override pools by mean; an explicit "none" keeps per-token vectors.
        self.pooling = llama.LLAMA_POOLING_TYPE_MEAN if pooling is None else pooling
        self._encoder_only = bool(llama.llama_model_has_encoder(model)) and not bool(
            llama.llama_model_has_decoder(model)
        )
        cp = llama.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = self.n_ctx
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = max(1, int(plan.n_threads))
        cp.embeddings = True
        cp.pooling_type = self.pooling
        self._ctx = llama.llama_init_from_model(model, cp)
        if not self._ctx:
            raise WontFit(
                f"llama.cpp could not create a {self.n_ctx}-token embedding context",
                hint="lower options.embed_ctx or free memory",
            )
        self._batch = llama.llama_batch_init(self.n_ctx, 0, 1)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embed_ids([self._tokenize(t) for t in texts])

    def embed_ids(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One pooled vector per token list: L2-normalised (a dot product is the cosine), except
        under rank pooling, where the "vector" is the reranker's raw relevance score(s)."""
        import numpy as np

        out: list[list[float]] = []
        with self._lock:
            if self._ctx is None:
                raise LocalrunError("the embedding context is closed", hint="load the model again")
            for i, tokens in enumerate(inputs):
                self._evaluate(tokens, i)
                if self.pooling == POOLING["rank"]:
                    out.append([float(v) for v in self._pooled()[: self.n_cls_out]])
                    continue
                vec = np.array(self._pooled()[: self.n_embd], dtype=np.float64)
                norm = float(np.linalg.norm(vec))
                out.append((vec / norm if norm > 0 else vec).tolist())
        return out

    def per_token(self, tokens: Sequence[int]) -> list[list[float]]:
        """Pooling none: one (unnormalised) vector per token, as llama-server's /embeddings gives."""
        with self._lock:
            if self._ctx is None:
                raise LocalrunError("the embedding context is closed", hint="load the model again")
            self._evaluate(tokens, 0)
            rows = []
            for i in range(len(tokens)):
                ptr = self._llama.llama_get_embeddings_ith(self._ctx, i)
                if not ptr:
                    raise UnsupportedFeature(
                        "llama.cpp kept no per-token vectors", param="input", hint="load the model with pooling none"
                    )
                rows.append([float(v) for v in ptr[: self.n_embd]])
            return rows

    def _evaluate(self, tokens: Sequence[int], index: int) -> None:
        llama = self._llama
        if not tokens:
            raise UnsupportedFeature(f"input[{index}] is empty", param="input", hint="send some text to embed")
        if len(tokens) > self.n_ctx:
            raise ContextOverflow(
                f"input[{index}] is {len(tokens)} tokens; the embedding context holds {self.n_ctx}",
                hint="split the text into shorter pieces",
            )
        mem = llama.llama_get_memory(self._ctx)
        if mem:
            llama.llama_memory_clear(mem, True)
        fill_batch(self._batch, tokens, range(len(tokens)), 0, True)
        run = llama.llama_encode if self._encoder_only else llama.llama_decode
        ctx, batch = self._ctx, self._batch
        rc = self._call(lambda: run(ctx, batch))
        if rc != 0:
            raise LocalrunError(
                f"llama.cpp failed to evaluate input[{index}] for embeddings (code {rc})",
                hint="retry with a shorter input",
            )

    def _pooled(self) -> Any:
        ptr = self._llama.llama_get_embeddings_seq(self._ctx, 0)
        if not ptr:
            raise UnsupportedFeature(
                "llama.cpp returned no pooled embedding for this model",
                param="input",
                hint="its pooling gives per-token vectors only: use /embeddings, or load it with --pooling mean",
            )
        return ptr

    def close(self) -> None:
        with self._lock:
            if self._batch is not None:
                self._llama.llama_batch_free(self._batch)
                self._batch = None
            if self._ctx is not None:
                self._llama.llama_free(self._ctx)
                self._ctx = None
