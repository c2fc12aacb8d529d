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

from localrun.chat.stops import StopMatcher

log = logging.getLogger(__name__)


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
