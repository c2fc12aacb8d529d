"""What a llama.cpp session offers beyond chat and completion: the calls behind llama-server's
utility routes (``runtimes.base.EXTRAS``): tokenize, detokenize, the template applied, /props,
embeddings with their tokens counted, and reranking.

One object :class:`~.session.LlamaCppSession` holds (its ``serve_*`` calls hand over to it).
Everything here runs in the worker, on the request's thread; the vocabulary is read under the
session's native lock (via :meth:`.prompting.Prompting.tokenize`), never after close. Reranking follows
llama-server's pairing for rank-pooled models: ``[BOS] query [EOS] [SEP] document [EOS]``,
scored by the model's classification head.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from localrun.runtimes.llamacpp.features import SessionFeatures
from localrun.runtimes.llamacpp.prompting import Prompting
from localrun.types import AUDIO, VISION

log = logging.getLogger(__name__)

#: Names of llama.cpp pooling types, for /props.
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


class ServerExtras:
    """llama-server's utility calls on one session, held by it (the session's ``serve_*`` calls).

    ``facts``: the context's numbers /props reports (``n_ctx``, ``total_slots``, ``n_vocab``)."""

    def __init__(
        self, llama: Any, vocab: Any, prompting: Prompting, features: SessionFeatures, *, facts: dict[str, int]
    ) -> None:
        self._llama, self._vocab = llama, vocab
        self._prompting, self._features, self._facts = prompting, features, facts

    def tokenize(self, content: str, add_special: bool = False, with_pieces: bool = False) -> dict[str, Any]:
        tokens = self._prompting.tokenize(content, add_special=add_special)
        if not with_pieces:
            return {"tokens": tokens}
        out = []
        for t in tokens:
            raw = self._features.piece(t)
            try:
                piece: str | list[int] = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)  # part of a character: llama-server sends the bytes
            out.append({"id": t, "piece": piece})
        return {"tokens": out}

    def detokenize(self, tokens: Sequence[int]) -> dict[str, Any]:
        self._prompting.check_tokens(tokens, "tokens")
        raw = b"".join(self._features.piece(int(t)) for t in tokens)
        return {"content": raw.decode("utf-8", errors="replace")}

    def apply_template(
        self,
        messages: list[dict[str, Any]],
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> dict[str, Any]:
        text, _ = self._prompting.chat_text(
            messages, dict(template_kwargs or {}), add_generation_prompt=add_generation_prompt
        )
        return {"prompt": text}

    def props(self, capabilities: frozenset[str]) -> dict[str, Any]:
        """/props: the context's facts, the template, the special tokens and what the model can do."""
        pooling, prompting = self._features.pooling, self._prompting
        return {
            **self._facts,
            "chat_template": prompting.chat_template or "",
            "chat_template_source": prompting.template_source(),
            "bos_token": prompting.bos,
            "eos_token": prompting.eos,
            "fim": bool(prompting.fim),
            "pooling": POOLING_NAMES.get(pooling) if pooling is not None else None,
            "capabilities": sorted(capabilities),
            # llama-server's shape: which media the loaded projector takes.
            "modalities": {"vision": VISION in capabilities, "audio": AUDIO in capabilities},
        }

    def embed_usage(self, inputs: Sequence[str | Sequence[int]]) -> dict[str, Any]:
        """Pooled vectors and how many tokens they took (OpenAI's usage, Ollama's prompt_eval_count)."""
        ids = self._input_ids(inputs)
        vectors = self._features.embedder().embed_ids(ids)
        return {"embeddings": vectors, "prompt_tokens": sum(len(t) for t in ids)}

    def embed_tokens(self, inputs: Sequence[str | Sequence[int]]) -> dict[str, Any]:
        """Per-token vectors when the pooling is none, pooled ones otherwise (llama-server's /embeddings)."""
        ids = self._input_ids(inputs)
        embedder = self._features.embedder()
        if embedder.pooling == 0:
            rows = [embedder.per_token(t) for t in ids]
        else:
            rows = [[v] for v in embedder.embed_ids(ids)]
        return {"embeddings": rows, "prompt_tokens": sum(len(t) for t in ids)}

    def rerank(self, query: str, documents: Sequence[str]) -> dict[str, Any]:
        """One relevance score per document, in the documents' order."""
        embedder = self._features.embedder(capability="rerank", param="query")
        llama, vocab = self._llama, self._vocab
        specials = [
            t for t in (llama.llama_vocab_bos(vocab), llama.llama_vocab_eos(vocab), llama.llama_vocab_sep(vocab))
        ]
        bos, eos, sep = ([t] if t >= 0 else [] for t in specials)
        tokenize = self._prompting.tokenize
        q = tokenize(query, add_special=False)
        pairs = [[*bos, *q, *eos, *sep, *tokenize(d, add_special=False), *eos] for d in documents]
        scores = [row[0] for row in embedder.embed_ids(pairs)]
        return {"scores": scores, "prompt_tokens": sum(len(p) for p in pairs)}

    def _input_ids(self, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
        ids = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                ids.append(self._prompting.tokenize(item, add_special=True))
            else:
                self._prompting.check_tokens(item, f"input[{i}]")
                ids.append([int(t) for t in item])
        return ids
