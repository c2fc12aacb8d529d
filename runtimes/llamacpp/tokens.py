"""The llama.cpp session's vocabulary side: tokenizing, the chat prompt's tokens (and where its
last user message begins, turns.py), and the one pass that finds every end-of-generation token.

A mixin of :class:`~.session.LlamaCppSession`, kept apart so the session stays about loading
and scheduling. It reads the session's ``_llama``, ``_vocab``, ``_n_vocab``, ``_native`` (the
lock close() takes before it frees the vocabulary), ``_closed``, ``_freed``, ``_features``,
``_bos``, ``_special_length`` and ``record``. :class:`EogScan` is started by ``open`` itself.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from localrun.errors import RuntimeUnavailable
from localrun.runtimes.llamacpp.media_prompt import MediaPrompt
from localrun.runtimes.llamacpp.turns import TurnPrompt, token_at, turn_bytes
from localrun.types import ChatRequest, Media

#: Tokens the end-token pass looks at between its checks for close() (about 1 ms of them).
EOG_SLICE = 1024


class EogScan:
    """Every end-of-generation token of a vocabulary, found by one raw pass on a thread of its own
    from the moment the model is loaded: the context is created meanwhile (in C, the GIL let go),
    so the pass is over before the first request can ask. ignore_eos and min_tokens need the set;
    looked up on the first such request it cost 0.5 s on Gemma's 262k vocabulary, and a pass
    started later (at the session's end of loading) still ran into a restart's first request.
    ``stop()`` ends it within a slice and waits: call it before the vocabulary is freed."""

    def __init__(self, llama, model, name: str) -> None:
        self._llama, self._vocab, self._name = llama, llama.llama_model_get_vocab(model), name
        self._n = llama.llama_vocab_n_tokens(self._vocab)
        self._stopping = False
        self._found: tuple[int, ...] | None = None
        self._thread = threading.Thread(target=self._run, name=f"eog-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        is_eog, vocab, n, found = self._llama.llama_vocab_is_eog, self._vocab, self._n, []
        for start in range(0, n, EOG_SLICE):
            if self._stopping:
                return
            found.extend(t for t in range(start, min(start + EOG_SLICE, n)) if is_eog(vocab, t))
        self._found = tuple(found)

    def result(self) -> tuple[int, ...]:
        self._thread.join()
        if self._found is None:
            raise RuntimeUnavailable(f"the llama.cpp session for {self._name} is closed", hint="load it again")
        return self._found

    def stop(self) -> None:
        self._stopping = True
        self._thread.join()


class SessionTokens:
    """Tokens in and out of one loaded model's vocabulary."""

    def _token_text(self, token: int) -> str:
        if token is None or token < 0:
            return ""
        raw = self._llama.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def _eog_reader(self):
        llama, vocab, known = self._llama, self._vocab, {}

        def is_eog(token: int) -> bool:
            hit = known.get(token)
            if hit is None:
                hit = known[token] = bool(llama.llama_vocab_is_eog(vocab, token))
            return hit

        return is_eog

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        with self._native:
            self._check_open()
            data = text.encode("utf-8")
            size = len(data) + 8
            buf = (self._llama.llama_token * size)()
            n = self._llama.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, True)
            if n < 0:
                size = -n
                buf = (self._llama.llama_token * size)()
                n = self._llama.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, True)
            return list(buf[:n])

    def _is_single_token(self, text: str) -> bool:
        toks = self.tokenize(text, add_special=False)
        return len(toks) == 1 and self._token_text(toks[0]) == text

    def chat_prompt(
        self,
        messages: Sequence,
        variables: dict | None = None,
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
        add_bos = not (self._bos and text.startswith(self._bos))
        if media:
            return self.media_prompt(text + prefix, media, add_special=add_bos), stops
        tokens = self.tokenize(text + prefix, add_special=add_bos)
        at = turn_bytes(text, messages)
        if at is None:
            return tokens, stops
        return TurnPrompt(tokens, lambda toks: self._turn_at(toks, at, add_bos)), stops

    def _turn_at(self, tokens: Sequence[int], at: int, add_bos: bool) -> int | None:
        # The scheduler thread asks, when a slot leaves (close() frees the vocabulary after it stops).
        if self._freed:
            return None
        return token_at(tokens, at, self._special_length, skip_first=add_bos)

    def chat_tokens(self, req: ChatRequest) -> tuple[list[int] | MediaPrompt, tuple[str, ...], str | None]:
        """(prompt tokens, stop strings, grammar) of a chat request: what ``chat`` runs and
        ``serve_count_prompt`` counts, so the two cannot disagree."""
        messages, variables, gbnf = self._features.chat_inputs(req, self.chat_template)
        tokens, stops = self.chat_prompt(
            messages,
            {**req.template_kwargs, **variables},
            add_generation_prompt=req.add_generation_prompt,
            continue_final=req.continue_final_message,
            prefix=req.prefix,
            media=req.media,
        )
        return tokens, stops, gbnf
