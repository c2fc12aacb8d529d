"""What a llama.cpp session offers beyond chat and completion: the session calls behind
llama-server's utility routes (``runtimes.base.EXTRAS``), token-id and fill-in-the-middle
prompts, and embeddings with their tokens counted.

A mixin of :class:`~.session.LlamaCppSession`, kept apart so the session stays about
loading and scheduling. Everything here runs in the worker, on the request's thread; the
vocabulary is read under the session's native lock (via ``tokenize``), never after close.

Fill-in-the-middle uses the vocabulary's own FIM tokens in prefix-suffix-middle order,
``[FIM_PRE] prefix [FIM_SUF] suffix [FIM_MID]``, as llama-server does; a model without them
does not declare ``fill-in-the-middle``, and the server's 400 says so. Reranking follows
llama-server's pairing for rank-pooled models: ``[BOS] query [EOS] [SEP] document [EOS]``,
scored by the model's classification head.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from localrun.chat.template import fallback_chat, render_chat
from localrun.errors import UnsupportedFeature
from localrun.runtimes.llamacpp.media.prompt import MediaPrompt
from localrun.runtimes.llamacpp.media.session import completion_text
from localrun.types import AUDIO, VISION, ChatRequest, CompletionRequest, Media

log = logging.getLogger(__name__)

#: Names of llama.cpp pooling types, for /props.
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


class ServerExtras:
    """Mixed into LlamaCppSession; uses its ``_llama``, ``_vocab``, ``_features``, ``tokenize``…"""

    def extra_capabilities(self) -> frozenset[str]:
        """Per-model capabilities found in the vocabulary: ``fill-in-the-middle``."""
        llama, vocab = self._llama, self._vocab
        fim = (llama.llama_vocab_fim_pre(vocab), llama.llama_vocab_fim_suf(vocab), llama.llama_vocab_fim_mid(vocab))
        self._fim = fim if all(t >= 0 for t in fim) else None
        return frozenset({"fill-in-the-middle"}) if self._fim else frozenset()

    # --- prompts ------------------------------------------------------------------------------

    def completion_tokens(self, req: CompletionRequest) -> list[int] | MediaPrompt:
        """The prompt of a completion: token ids as sent, a fill-in-the-middle frame, or the text
        (with its media, a :class:`MediaPrompt`)."""
        if req.media:
            if req.suffix is not None or req.prompt_tokens:
                raise UnsupportedFeature(
                    "media go with a text prompt, not with token ids or a fill-in-the-middle suffix",
                    param="prompt",
                    hint="send the prompt as text with the media",
                )
            return self.media_prompt(completion_text(req.prompt, req.media), req.media, add_special=True)
        if req.suffix is not None:
            return self.infill_tokens(req.prompt, req.suffix, req.middle)
        if req.prompt_tokens:
            self._features.check_tokens(req.prompt_tokens, "prompt")
            return list(req.prompt_tokens)
        return self.tokenize(req.prompt, add_special=True)

    def infill_tokens(self, prefix: str, suffix: str, middle: str = "") -> list[int]:
        if not self._fim:
            raise UnsupportedFeature(
                f"{self.record.name} has no fill-in-the-middle tokens (FIM_PRE, FIM_SUF, FIM_MID)",
                param="suffix",
                hint="use a code model with FIM tokens, or leave 'suffix' out",
            )
        pre, suf, mid = self._fim
        bos = self._llama.llama_vocab_bos(self._vocab)
        head = [bos] if bos >= 0 and self._llama.llama_vocab_get_add_bos(self._vocab) else []
        start = self.tokenize(middle, add_special=False) if middle else []
        return [
            *head,
            pre,
            *self.tokenize(prefix, add_special=False),
            suf,
            *self.tokenize(suffix, add_special=False),
            mid,
            *start,
        ]

    def media_prompt(self, text: str, media: Sequence[Media], *, add_special: bool) -> MediaPrompt:
        """``text`` (one MEDIA_MARKER per item) and ``media`` as the scheduler's prompt (media_session.py)."""
        self._check_open()
        return self._media.prompt(text, media, add_special=add_special, max_chunk=self._n_ubatch)

    def chat_text(
        self,
        messages: Sequence,
        variables: dict | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
    ) -> tuple[str, tuple[str, ...]]:
        """The rendered conversation as text (what /apply-template shows), and its stop strings.

        ``continue_final`` renders the last message as a finished turn and cuts the text right
        after its content, so the model goes on writing it (vLLM's ``continue_final_message``).
        """
        if self.chat_template:
            text = render_chat(
                self.chat_template,
                messages,
                bos_token=self._bos,
                eos_token=self._eos,
                timeout_s=self._template_timeout_s,
                variables=variables,
                add_generation_prompt=add_generation_prompt and not continue_final,
            )
            stops: tuple[str, ...] = ()
        else:
            fallback = fallback_chat(messages, gemma_turns=self._gemma_turns)
            text, stops = fallback.text, fallback.stop
        if continue_final and messages:
            last = messages[-1]
            content = last.get("content") if isinstance(last, dict) else getattr(last, "content", "")
            cut = text.rfind(content) if content else -1
            if cut < 0:
                raise UnsupportedFeature(
                    "'continue_final_message' needs a last message with text the template keeps",
                    param="continue_final_message",
                    hint="end the conversation with the text to continue",
                )
            text = text[: cut + len(content)]
        return text, stops

    # --- utility calls (runtimes.base.EXTRAS) -------------------------------------------------------

    def serve_tokenize(self, content: str, add_special: bool = False, with_pieces: bool = False) -> dict[str, Any]:
        tokens = self.tokenize(content, add_special=add_special)
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

    def serve_detokenize(self, tokens: Sequence[int]) -> dict[str, Any]:
        self._features.check_tokens(tokens, "tokens")
        raw = b"".join(self._features.piece(int(t)) for t in tokens)
        return {"content": raw.decode("utf-8", errors="replace")}

    def serve_apply_template(
        self, messages: list[dict], template_kwargs: dict | None = None, add_generation_prompt: bool = True
    ) -> dict[str, Any]:
        text, _ = self.chat_text(messages, dict(template_kwargs or {}), add_generation_prompt=add_generation_prompt)
        return {"prompt": text}

    def serve_count_prompt(self, request: dict[str, Any]) -> dict[str, Any]:
        """How many tokens a chat request (a ``ChatRequest`` as a dict) renders to, without running
        it: Anthropic's ``message_start`` carries the prompt's size before the prefill starts."""
        self._check_open()
        tokens, _, _ = self.chat_tokens(ChatRequest.from_dict(request))
        if isinstance(tokens, MediaPrompt):  # media counted too (the image's tokens), then freed
            tokens.close()
            return {"prompt_tokens": len(tokens.tokens)}
        return {"prompt_tokens": len(tokens)}

    def serve_props(self) -> dict[str, Any]:
        pooling = self._features.pooling
        return {
            "n_ctx": self.n_ctx,
            "total_slots": self.layout.n_slots,
            "n_vocab": self._n_vocab,
            "chat_template": self.chat_template or "",
            "chat_template_source": self.template_source(),
            "bos_token": self._bos,
            "eos_token": self._eos,
            "fim": bool(self._fim),
            "pooling": POOLING_NAMES.get(pooling) if pooling is not None else None,
            "capabilities": sorted(self.capabilities),
            # llama-server's shape: which media the loaded projector takes.
            "modalities": {"vision": VISION in self.capabilities, "audio": AUDIO in self.capabilities},
        }

    def template_source(self) -> str:
        if self.plan.options.get("chat_template") is not None:
            return "override"
        return "gguf" if self.chat_template else "fallback"

    def serve_embed_usage(self, inputs: Sequence[str | Sequence[int]]) -> dict[str, Any]:
        """Pooled vectors and how many tokens they took (OpenAI's usage, Ollama's prompt_eval_count)."""
        ids = self._input_ids(inputs)
        vectors = self._features.embedder().embed_ids(ids)
        return {"embeddings": vectors, "prompt_tokens": sum(len(t) for t in ids)}

    def serve_embed_tokens(self, inputs: Sequence[str | Sequence[int]]) -> dict[str, Any]:
        """Per-token vectors when the pooling is none, pooled ones otherwise (llama-server's /embeddings)."""
        ids = self._input_ids(inputs)
        embedder = self._features.embedder()
        if embedder.pooling == 0:
            rows = [embedder.per_token(t) for t in ids]
        else:
            rows = [[v] for v in embedder.embed_ids(ids)]
        return {"embeddings": rows, "prompt_tokens": sum(len(t) for t in ids)}

    def serve_rerank(self, query: str, documents: Sequence[str]) -> dict[str, Any]:
        """One relevance score per document, in the documents' order."""
        embedder = self._features.embedder(capability="rerank", param="query")
        llama, vocab = self._llama, self._vocab
        specials = [
            t for t in (llama.llama_vocab_bos(vocab), llama.llama_vocab_eos(vocab), llama.llama_vocab_sep(vocab))
        ]
        bos, eos, sep = ([t] if t >= 0 else [] for t in specials)
        q = self.tokenize(query, add_special=False)
        pairs = [[*bos, *q, *eos, *sep, *self.tokenize(d, add_special=False), *eos] for d in documents]
        scores = [row[0] for row in embedder.embed_ids(pairs)]
        return {"scores": scores, "prompt_tokens": sum(len(p) for p in pairs)}

    def _input_ids(self, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
        ids = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                ids.append(self.tokenize(item, add_special=True))
            else:
                self._features.check_tokens(item, f"input[{i}]")
                ids.append([int(t) for t in item])
        return ids
