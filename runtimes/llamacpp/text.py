"""Turning a token stream into chunk text: split UTF-8 and stop strings.

Pure Python with no llama.cpp import, so the fake runtime uses the same rules and the
contract tests hold both to them.

* A token is a byte string; one character can span several tokens (emoji, CJK under a
  byte-fallback vocabulary). An incremental UTF-8 decoder keeps the incomplete tail until
  the next token completes it; invalid bytes become U+FFFD rather than stalling the stream.
* A stop string can also span tokens. Text that might be the start of a stop string is held
  back until the next token shows whether it is; the answer is cut right before the stop.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)


class StopMatcher:
    """Finds the earliest stop string in a growing text, holding back possible prefixes."""

    __slots__ = ("_stops", "_pending")

    def __init__(self, stops: Iterable[str] = ()) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add ``text``; return (text safe to emit now, whether a stop string was hit)."""
        if not self._stops:
            return text, False
        pending = self._pending + text
        hits = [i for i in (pending.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._pending = ""
            return pending[: min(hits)], True
        hold = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(pending)), hold, -1):
                if pending.endswith(stop[:k]):
                    hold = k
                    break
        cut = len(pending) - hold
        self._pending = pending[cut:]
        return pending[:cut], False

    def flush(self) -> str:
        """The held-back text, once the stream ends without completing a stop string."""
        text, self._pending = self._pending, ""
        return text


class TextAssembler:
    """Token bytes in, chunk text out (see the module docstring)."""

    __slots__ = ("_decoder", "_stops")

    def __init__(self, stops: Iterable[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopMatcher(stops)

    def feed(self, piece: bytes) -> tuple[str, bool]:
        """Return (text to emit, stopped)."""
        return self._stops.push(self._decoder.decode(piece))

    def finish(self) -> str:
        """Whatever is still buffered when generation ends for a reason other than a stop."""
        tail, stopped = self._stops.push(self._decoder.decode(b"", final=True))
        return tail if stopped else tail + self._stops.flush()
