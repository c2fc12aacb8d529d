"""A prompt with images and audio in it, as the scheduler and the prefix cache see it.

Pure Python, no llama.cpp: :mod:`.mtmd` builds a :class:`MediaPrompt` from ``mtmd_tokenize``'s
chunks, :mod:`.prefill` feeds it to the context, :mod:`..cache.prefix` keeps it whole.

A prompt stays one list of ints, one per KV position, so the radix index (:mod:`..cache.radix`), the
slots and ``Usage`` need no second representation. A media chunk occupies its ``n_tokens``
positions with *pseudo-token ids*: negative numbers (real token ids are >= 0, and requests
with negative ids are refused before they get here) derived from the chunk's content digest
(the decoded bitmap's hash, ``mtmd_bitmap_set_id``) and its length. So the prefix cache
matches the same image again and never a different one: two images rendered into the same
text differ in every position of their chunk. The first position of a chunk takes its id
from a range of its own (below ``-2**30``), the others from ``[-2**30, -1]``: that is what
lets :func:`media_safe_cut` see, from the tokens alone, where a chunk starts.

A cached prefix may end at a chunk's end, never inside it: image tokens attend to each other
(Gemma 3 decodes them non-causally), so the KV of a chunk's first half depends on its second
half, and re-evaluating only the tail would read a wrong half. :func:`media_safe_cut` backs a
cut inside a chunk up to the chunk's start.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: Pseudo ids of a chunk's first position are below this; the rest lie in [START_BELOW, -1].
START_BELOW = -(1 << 30)
_MASK = (1 << 30) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def pseudo_ids(digest: str, n_tokens: int) -> list[int]:
    """The ``n_tokens`` pseudo-token ids of a media chunk whose content hashes to ``digest``.

    The length is hashed in too, so one clip cut into chunks of other sizes never matches."""
    if n_tokens <= 0:
        return []
    raw = hashlib.blake2b(f"{digest}\0{n_tokens}".encode(), digest_size=16).digest()
    h, g = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
    first = START_BELOW - 1 - (h & _MASK)
    return [first] + [-1 - (((g + i * _GOLDEN) >> 17) & _MASK) for i in range(1, n_tokens)]


def is_media(token: int) -> bool:
    return token < 0


def starts_media(token: int) -> bool:
    return token < START_BELOW


def media_safe_cut(tokens: Sequence[int], keep: int) -> int:
    """``keep`` moved back to the start of the media chunk it would end inside (if any): a
    prefix of ``tokens[:keep]`` then holds whole chunks only."""
    n = len(tokens)
    while 0 < keep < n and START_BELOW <= tokens[keep] < 0:
        keep -= 1
    return keep


@dataclass
class MediaSpan:
    """One media chunk of a prompt: positions ``start .. start + n_tokens``."""

    start: int
    n_tokens: int
    kind: str  # "image" | "audio"
    index: int  # the chunk's index, counted across the prompt's native chunk lists (mtmd.NativeChunks)
    digest: str
    non_causal: bool = False  # decode it with causal attention off (Gemma 3's images)

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


@dataclass
class MediaPrompt:
    """A prompt's positions (text token ids and pseudo ids) and its media chunks, in order.

    ``native`` owns the native chunk list (``close()`` frees it; :mod:`.mtmd`); ``users`` counts
    the jobs (choices of one request) that still need it."""

    tokens: list[int]
    spans: list[MediaSpan]
    native: Any = None
    users: int = 1
    cancelled: bool = field(default=False)

    @property
    def media_tokens(self) -> int:
        return sum(s.n_tokens for s in self.spans)

    def span_at(self, pos: int) -> MediaSpan | None:
        """The chunk that starts at ``pos``, if one does."""
        for span in self.spans:
            if span.start == pos:
                return span
            if span.start > pos:
                return None
        return None

    def text_run(self, pos: int) -> int:
        """How many text positions follow ``pos`` before the next chunk (or the prompt's end)."""
        for span in self.spans:
            if span.start >= pos:
                return span.start - pos
        return len(self.tokens) - pos

    def pending(self, cached: int) -> list[MediaSpan]:
        """The chunks still to encode when the first ``cached`` positions came from the cache."""
        return [s for s in self.spans if s.start >= cached]

    def close(self) -> None:
        """Free the native chunks (idempotent)."""
        native, self.native = self.native, None
        if native is not None:
            native.close()
