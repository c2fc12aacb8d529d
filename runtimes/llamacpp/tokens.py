"""A llama.cpp vocabulary's tokens: one ``llama_tokenize`` call, the rules for tokenizing a long
text in pieces (token_split.py), the end-of-generation test, and the one pass that finds every
end-of-generation token (:class:`VocabScan`, started by the session's ``open`` itself). The
session's prompts built on these are :mod:`.prompting`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from localrun.errors import RuntimeUnavailable

#: Tokens the end-token pass looks at between its checks for close() (about 1 ms of them).
EOG_SLICE = 1024
#: llama_token_attr bits: the tokens llama.cpp's tokenizer finds by their text (CONTROL,
#: USER_DEFINED, UNKNOWN), and LSTRIP.
SPECIAL_ATTRS = (1 << 3) | (1 << 4) | (1 << 0)
ATTR_LSTRIP = 1 << 7
#: llama_vocab_type values whose raw runs are tokenized each on its own (token_split.py).
SPM = 1
SPLIT_VOCABS = (SPM, 2)  # and BPE
#: SentencePiece's word boundary, which a space prefix puts before a run's first word.
SPM_SPACE = "\u2581".encode()


def tokenize_bytes(llama: Any, vocab: Any, data: bytes, add_special: bool) -> list[int]:
    """One ``llama_tokenize`` call over ``data`` (special tokens parsed)."""
    size = len(data) + 8
    buf = (llama.llama_token * size)()
    n = llama.llama_tokenize(vocab, data, len(data), buf, size, add_special, True)
    if n < 0:
        size = -n
        buf = (llama.llama_token * size)()
        n = llama.llama_tokenize(vocab, data, len(data), buf, size, add_special, True)
    return list(buf[:n])


def split_rules(llama: Any, vocab: Any) -> tuple[bool, bool]:
    """(may a long text be tokenized in pieces, may raw text be cut after a newline) for this
    vocabulary (token_split.py): pieces for SPM and BPE that add no end or separator token; raw
    cuts for SPM without a space prefix (the C API does not say; one word's first token shows it),
    which carries nothing from one raw run to the next."""
    kind = llama.llama_vocab_type(vocab)
    pieces = kind in SPLIT_VOCABS and not llama.llama_vocab_get_add_eos(vocab)
    pieces = pieces and not (hasattr(llama, "llama_vocab_get_add_sep") and llama.llama_vocab_get_add_sep(vocab))
    if not pieces or kind != SPM:
        return pieces, False
    first = tokenize_bytes(llama, vocab, b"a", False)[:1]
    return True, not (first and llama.llama_vocab_get_text(vocab, first[0]).startswith(SPM_SPACE))


class VocabScan:
    """Every end-of-generation token of a vocabulary, found by one raw pass on a thread of its own
    from the moment the model is loaded: the context is created meanwhile (in C, the GIL let go),
    so the pass is over before the first request can ask. ignore_eos and min_tokens need the set;
    looked up on the first such request it cost 0.5 s on Gemma's 262k vocabulary, and a pass
    started later (at the session's end of loading) still ran into a restart's first request.
    The same pass keeps the special tokens' texts and, for SPM, what follows a newline inside a
    token: where a long text may be cut for tokenizing on threads (token_split.py; 0.09 s of
    pass on Gemma's vocabulary without them, 0.28 s with). ``stop()`` ends it within a slice and
    waits: call it before the vocabulary is freed."""

    def __init__(self, llama: Any, model: Any, name: str) -> None:
        self._llama, self._vocab, self._name = llama, llama.llama_model_get_vocab(model), name
        self._n = llama.llama_vocab_n_tokens(self._vocab)
        self._stopping = False
        self._found: tuple[int, ...] | None = None
        self._special: tuple[tuple[bytes, bool], ...] = ()
        self._followers: frozenset[int] = frozenset()
        self._thread = threading.Thread(target=self._run, name=f"eog-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        llama, vocab, n, found, special, followers = self._llama, self._vocab, self._n, [], [], set()
        is_eog, attr_of, text_of = llama.llama_vocab_is_eog, llama.llama_vocab_get_attr, llama.llama_vocab_get_text
        spm = llama.llama_vocab_type(vocab) == SPM  # newline followers: only SPM cuts raw text
        for start in range(0, n, EOG_SLICE):
            if self._stopping:
                return
            for t in range(start, min(start + EOG_SLICE, n)):
                if is_eog(vocab, t):
                    found.append(t)
                attr = attr_of(vocab, t)
                if not (spm or attr & SPECIAL_ATTRS):
                    continue
                text = text_of(vocab, t) or b""
                if attr & SPECIAL_ATTRS:  # what llama.cpp's tokenizer matches in text (token_split.py)
                    special.append((text, bool(attr & ATTR_LSTRIP)))
                at = text.find(b"\n") if spm else -1
                while 0 <= at < len(text) - 1:  # a byte some token puts after a newline
                    followers.add(text[at + 1])
                    at = text.find(b"\n", at + 1)
        self._special = tuple(special)
        self._followers = frozenset(followers)
        self._found = tuple(found)

    def specials(self) -> tuple[tuple[bytes, bool], ...] | None:
        """(text, strips whitespace on its left) of every special token; None until the pass is done."""
        return self._special if self._found is not None else None

    def newline_followers(self) -> frozenset[int]:
        """Every byte some token's text holds right after a newline (read after :meth:`specials`)."""
        return self._followers

    def result(self) -> tuple[int, ...]:
        self._thread.join()
        if self._found is None:
            raise RuntimeUnavailable(f"the llama.cpp session for {self._name} is closed", hint="load it again")
        return self._found

    def stop(self) -> None:
        self._stopping = True
        self._thread.join()


def eog_reader(llama: Any, vocab: Any) -> Callable[[int], bool]:
    """``is_eog(token)`` for the scheduler: llama.cpp's answer, cached per token."""
    known: dict[int, bool] = {}

    def is_eog(token: int) -> bool:
        hit = known.get(token)
        if hit is None:
            hit = known[token] = bool(llama.llama_vocab_is_eog(vocab, token))
        return hit

    return is_eog
