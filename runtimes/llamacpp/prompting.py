"""A llama.cpp session's prompts: tokens in and out of the model's vocabulary, the chat prompt's
text and tokens (and where its last user message begins, :mod:`.turns`), fill-in-the-middle
frames, and prompts with images or audio (:mod:`.media.session`).

One object :class:`~.session.LlamaCppSession` holds. The vocabulary is native memory the session
frees at close: tokenizing runs under the session's ``native`` lock and checks ``check_open``
first; the scheduler thread asks :meth:`Prompting.turn_at` when a slot leaves, and gets None once
``is_freed`` says the vocabulary is gone.

Fill-in-the-middle uses the vocabulary's own FIM tokens in prefix-suffix-middle order,
``[FIM_PRE] prefix [FIM_SUF] suffix [FIM_MID]``, as llama-server does; a model without them
does not declare ``fill-in-the-middle``, and the server's 400 says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from localrun.chat.template import fallback_chat, render_chat
from localrun.errors import UnsupportedFeature
from localrun.runtimes.llamacpp.media.prompt import MediaPrompt
from localrun.runtimes.llamacpp.media.session import SessionMedia, completion_text
from localrun.runtimes.llamacpp.token_split import FALLBACK_MARKERS, Splitter
from localrun.runtimes.llamacpp.tokens import VocabScan, split_rules, tokenize_bytes
from localrun.runtimes.llamacpp.turns import (
    TurnPrompt,
    last_part_bytes,
    special_piece_reader,
    token_at,
    turn_bytes,
)
from localrun.types import CompletionRequest, Media, ModelRecord, Plan


class Prompting:
    """Tokens, chat text and media prompts of one loaded model."""

    def __init__(
        self,
        llama: Any,
        model: Any,
        *,
        record: ModelRecord,
        plan: Plan,
        eog: VocabScan,
        media: SessionMedia,
        max_chunk: int,
        native: threading.Lock,
        check_open: Callable[[], None],
        is_freed: Callable[[], bool],
    ) -> None:
        self._llama, self._name, self._plan = llama, record.name, plan
        self._vocab = vocab = llama.llama_model_get_vocab(model)
        self.n_vocab = llama.llama_vocab_n_tokens(vocab)
        self._media, self._max_chunk = media, max_chunk
        self._native, self._check_open, self._is_freed = native, check_open, is_freed
        self.bos = self.token_text(llama.llama_vocab_bos(vocab))
        self.eos = self.token_text(llama.llama_vocab_eos(vocab))
        template = plan.options.get("chat_template")
        if template is None:
            raw = llama.llama_model_chat_template(model, None)
            template = raw.decode("utf-8", errors="replace") if raw else None
        self.chat_template: str | None = template or None
        splits, raw_cuts = split_rules(llama, vocab)
        # Pieces start at the template's special texts; without one, at the turn markers the
        # fallback formats write (only those that are this vocabulary's special tokens count).
        # Raw text may be cut after a newline too (an agent's system prompt has no markers).
        markers = (self.chat_template or "") + "".join((self.bos, self.eos, *FALLBACK_MARKERS))
        followers = eog.newline_followers if raw_cuts else None
        self.splitter = Splitter(eog.specials, markers, plan.n_threads if splits else 1, followers)
        # Without a template: a plain transcript by default. Measured on the base Gemma 3
        # 270M: with Gemma's turn markers it babbles, with the transcript it answers
        # "The capital of France is Paris." Instruction-tuned files carry their template.
        self._gemma_turns = plan.options.get("fallback_format") == "gemma" and self.is_single_token("<start_of_turn>")
        self._template_timeout_s = float(plan.options.get("template_timeout_s", 2.0))
        self._special_length = special_piece_reader(llama, vocab)  # where a prompt's last turn begins
        fim = (llama.llama_vocab_fim_pre(vocab), llama.llama_vocab_fim_suf(vocab), llama.llama_vocab_fim_mid(vocab))
        self.fim = fim if all(t >= 0 for t in fim) else None
        #: Per-model capabilities found in the vocabulary: ``fill-in-the-middle``.
        self.capabilities = frozenset({"fill-in-the-middle"}) if self.fim else frozenset()

    # --- tokens ---------------------------------------------------------------------------------

    def token_text(self, token: int) -> str:
        if token is None or token < 0:
            return ""
        raw = self._llama.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        """``text``'s tokens; a long one in pieces on the session's threads (token_split.py)."""
        with self._native:
            self._check_open()
            data = text.encode("utf-8")
            cuts = self.splitter.cuts(data)
            if not cuts:
                return self.tokenize_bytes(data, add_special)
            return self.splitter.run(self.tokenize_bytes, data, cuts, add_special)

    def tokenize_bytes(self, data: bytes, add_special: bool) -> list[int]:
        return tokenize_bytes(self._llama, self._vocab, data, add_special)

    def is_single_token(self, text: str) -> bool:
        toks = self.tokenize(text, add_special=False)
        return len(toks) == 1 and self.token_text(toks[0]) == text

    def check_tokens(self, tokens: Sequence[int], param: str) -> None:
        """A 400 for a token id outside the vocabulary (llama.cpp would read past its tables)."""
        bad = next((t for t in tokens if not 0 <= int(t) < self.n_vocab), None)
        if bad is not None:
            raise UnsupportedFeature(
                f"{param!r} has token id {bad}, outside {self._name}'s vocabulary of {self.n_vocab}",
                param=param,
                hint=f"use token ids from 0 to {self.n_vocab - 1} (see /tokenize)",
            )

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
            self.check_tokens(req.prompt_tokens, "prompt")
            return list(req.prompt_tokens)
        tokens = self.tokenize(req.prompt, add_special=True)
        at = last_part_bytes(req.prompt)
        if at is None:
            return tokens
        # A state worth leaving where its last part begins: the next prompt may share all before it.
        bos = bool(tokens) and tokens[0] == self._llama.llama_vocab_bos(self._vocab)
        return TurnPrompt(tokens, lambda toks: self.turn_at(toks, at, bos))

    def infill_tokens(self, prefix: str, suffix: str, middle: str = "") -> list[int]:
        if not self.fim:
            raise UnsupportedFeature(
                f"{self._name} has no fill-in-the-middle tokens (FIM_PRE, FIM_SUF, FIM_MID)",
                param="suffix",
                hint="use a code model with FIM tokens, or leave 'suffix' out",
            )
        pre, suf, mid = self.fim
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

    # --- chat ---------------------------------------------------------------------------------

    def chat_text(
        self,
        messages: Sequence[Any],
        variables: dict[str, Any] | None = None,
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
                bos_token=self.bos,
                eos_token=self.eos,
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
            content = (last.get("content") if isinstance(last, dict) else getattr(last, "content", "")) or ""
            cut = text.rfind(content) if content else -1
            if cut < 0:
                raise UnsupportedFeature(
                    "'continue_final_message' needs a last message with text the template keeps",
                    param="continue_final_message",
                    hint="end the conversation with the text to continue",
                )
            text = text[: cut + len(content)]
        return text, stops

    def chat_prompt(
        self,
        messages: Sequence[Any],
        variables: dict[str, Any] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
        prefix: str = "",
        media: Sequence[Media] = (),
    ) -> tuple[list[int] | MediaPrompt, tuple[str, ...]]:
        """Tokens of the rendered conversation (and the answer's ``prefix``), and stop strings the
        prompt format adds; with ``media``, a :class:`MediaPrompt` (its tokens and media chunks)."""
        text, stops = self.chat_text(
            messages, variables, add_generation_prompt=add_generation_prompt, continue_final=continue_final
        )
        add_bos = not (self.bos and text.startswith(self.bos))
        if media:
            return self.media_prompt(text + prefix, media, add_special=add_bos), stops
        tokens = self.tokenize(text + prefix, add_special=add_bos)
        at = turn_bytes(text, messages)
        if at is None:
            return tokens, stops
        return TurnPrompt(tokens, lambda toks: self.turn_at(toks, at, add_bos)), stops

    def turn_at(self, tokens: Sequence[int], at: int, add_bos: bool) -> int | None:
        """Where the prompt's last user message begins, in tokens (``at``: in bytes of its text)."""
        # The scheduler thread asks, when a slot leaves (close() frees the vocabulary after it stops).
        if self._is_freed():
            return None
        return token_at(tokens, at, self._special_length, skip_first=add_bos)

    def template_source(self) -> str:
        if self._plan.options.get("chat_template") is not None:
            return "override"
        return "gguf" if self.chat_template else "fallback"

    # --- media ----------------------------------------------------------------------------------

    def media_prompt(self, text: str, media: Sequence[Media], *, add_special: bool) -> MediaPrompt:
        """``text`` (one MEDIA_MARKER per item) and ``media`` as the scheduler's prompt (media/session.py)."""
        self._check_open()
        return self._media.prompt(text, media, add_special=add_special, max_chunk=self._max_chunk)

    def close(self) -> None:
        self.splitter.close()
