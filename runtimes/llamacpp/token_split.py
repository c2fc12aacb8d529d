"""A long text tokenized in pieces on threads, to exactly the tokens one call gives.

A restart's first agent request (16k tokens of Gemma 3, 64 KB of text) spent ~55 ms of its
~190 ms to the first token in one ``llama_tokenize`` call on one core. llama-server pays that
too; this is how localrun doesn't.

The split is safe because of how llama.cpp tokenizes. It first cuts the text at every occurrence
of a special token's text, longest texts first, and matches each one inside what is still raw
text. Then it tokenizes each raw run between them on its own. For SPM and BPE vocabularies, the
only thing carried from one run to the next is whether the run before was a special token. So a
cut at the start of an occurrence of special token ``S`` changes nothing, provided that:

* no other special text overlaps that occurrence and reaches outside it (a longer one would be
  matched first there, and one that crosses the cut is half in each piece);
* ``S`` does not strip whitespace on its left (LSTRIP: the left piece would keep it);
* the vocabulary adds no end-of-text or separator token (add_special would put one after the
  left piece); only the first piece gets the start token.

Cuts are made only before the special tokens the chat template writes (its turn markers), at
the occurrence nearest each equal share of the text. The session checks the vocabulary's
kind; tests/runtimes/test_token_split.py compares pieces with one call on real vocabularies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

#: No piece is shorter than this (threads cost more than they save on a short text).
MIN_PIECE_BYTES = 8 << 10
#: Occurrences of a marker tried past each share's point before that cut is given up.
TRIES = 8
#: Most pieces of one text.
MAX_PIECES = 8
#: Turn markers a prompt without a chat template may hold (Gemma's, ChatML's).
FALLBACK_MARKERS = ("<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class Specials:
    """The special tokens' texts by length, and the markers a piece may start with."""

    by_length: dict[int, frozenset[bytes]]
    markers: tuple[bytes, ...]


def specials_from(
    tokens: Iterable[tuple[bytes, bool]], template: str | None, *, need_markers: bool = True
) -> Specials | None:
    """``tokens``: (text, strips whitespace on its left) of every special token. Markers are the
    texts the chat template holds that strip nothing. None where no marker is found and
    ``need_markers``."""
    by_length: dict[int, set[bytes]] = {}
    markers = []
    source = (template or "").encode("utf-8", errors="replace")
    for text, lstrip in tokens:
        if not text:
            continue
        by_length.setdefault(len(text), set()).add(text)
        if not lstrip and len(text) >= 3 and text in source:
            markers.append(text)
    if not markers and need_markers:
        return None
    return Specials({n: frozenset(t) for n, t in by_length.items()}, tuple(sorted(set(markers))))


def _safe(data: bytes, specials: Specials, at: int, size: int) -> bool:
    """No special text other than the one at ``data[at:at+size]`` overlaps it and reaches
    outside it."""
    end = at + size
    for n, texts in specials.by_length.items():
        for p in range(max(0, at - n + 1), min(end, len(data) - n + 1)):
            if at <= p and p + n <= end:
                continue  # inside the occurrence: that one is matched first, or is this one
            if data[p : p + n] in texts:
                return False
    return True


def _cut_near(data: bytes, specials: Specials, target: int, lo: int, hi: int) -> int | None:
    """The safe marker occurrence in ``[lo, hi]`` nearest ``target``, else None."""
    best = None
    for marker in specials.markers:
        for step in (1, -1):  # the first safe one after the target, and the first before it
            n = len(marker)
            at = data.find(marker, target, hi + n) if step > 0 else data.rfind(marker, lo, target - 1 + n)
            for _ in range(TRIES):
                if at < 0 or not lo <= at <= hi:
                    break
                if best is not None and abs(at - target) >= abs(best - target):
                    break
                if _safe(data, specials, at, n):
                    best = at
                    break
                at = data.find(marker, at + 1, hi + n) if step > 0 else data.rfind(marker, lo, at - 1 + n)
    return best


def _newline_cut_near(
    data: bytes, specials: Specials, followers: frozenset[int], target: int, lo: int, hi: int
) -> int | None:
    """The cut right after a newline in ``[lo, hi]`` nearest ``target`` that no token can merge
    across (no token holds that newline and the byte after it) and no special text spans."""
    best = None
    for step in (1, -1):
        at = data.find(b"\n", target - 1, hi) if step > 0 else data.rfind(b"\n", lo - 1, target - 1)
        for _ in range(TRIES * 8):
            if at < 0:
                break
            cut = at + 1
            if not lo <= cut <= hi or (best is not None and abs(cut - target) >= abs(best - target)):
                break
            if data[cut] not in followers and _safe(data, specials, cut, 0):
                best = cut
                break
            at = data.find(b"\n", at + 1, hi) if step > 0 else data.rfind(b"\n", lo - 1, at)
    return best


def cut_points(
    data: bytes, specials: Specials | None, pieces: int, followers: frozenset[int] | None = None
) -> list[int]:
    """Where each piece after the first starts: up to ``pieces`` pieces of at least
    :data:`MIN_PIECE_BYTES`; [] for one piece (a short text, no place to cut). ``followers``
    (SPM vocabularies without a space prefix): raw text may be cut after a newline too."""
    pieces = min(pieces, MAX_PIECES, len(data) // MIN_PIECE_BYTES)
    if specials is None or pieces < 2:
        return []
    cuts: list[int] = []
    for i in range(1, pieces):
        lo, hi = (cuts[-1] if cuts else 0) + MIN_PIECE_BYTES, len(data) - MIN_PIECE_BYTES
        target = max(lo, len(data) * i // pieces)
        found = [_cut_near(data, specials, target, lo, hi)]
        if followers is not None:
            found.append(_newline_cut_near(data, specials, followers, target, lo, hi))
        near = [at for at in found if at is not None]
        if near:
            cuts.append(min(near, key=lambda at: abs(at - target)))
    return cuts


def pieces_of(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


class Splitter:
    """One session's split: its special tokens (``specials()``: None until the vocabulary pass
    is done, and then no text is split), its chat template and its threads (1: never split)."""

    def __init__(
        self,
        specials: Callable[[], Iterable[tuple[bytes, bool]] | None],
        template: str | None,
        threads: int,
        followers: Callable[[], frozenset[int]] | None = None,
    ):
        self._source, self._template, self._followers_of = specials, template, followers
        self._followers: frozenset[int] | None = None
        self._threads = max(1, min(int(threads), MAX_PIECES))
        self._specials: Specials | None = None
        self._ready = self._threads < 2
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def cuts(self, data: bytes) -> list[int]:
        if self._threads < 2 or len(data) < 2 * MIN_PIECE_BYTES:
            return []
        if not self._ready:
            found = self._source()
            if found is None:
                return []
            followers_of = self._followers_of
            raw = followers_of is not None  # newline cuts need no marker
            specials = specials_from(found, self._template, need_markers=not raw)
            if followers_of is not None:
                self._followers = followers_of()
            self._specials, self._ready = specials, True
        return cut_points(data, self._specials, self._threads, self._followers)

    def run(self, fn: Callable[[bytes, bool], list[int]], data: bytes, cuts: list[int], add_special: bool) -> list[int]:
        """``fn(piece, add_special)`` over the pieces, the first on this thread, joined in order."""
        parts = pieces_of(data, cuts)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._threads - 1, thread_name_prefix="tokenize")
            rest = [self._pool.submit(fn, part, False) for part in parts[1:]]
        out = fn(parts[0], add_special)
        for future in rest:
            out.extend(future.result())
        return out

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
