"""Stop strings in text that arrives in pieces: one matcher for every runtime and route.

Pure Python. Text that could still become a stop string is held back, so no part of a stop
string ever reaches a client, even when it is split across pieces; the answer is cut right
before the stop that starts first in the whole text — also when a shorter stop completes
inside a longer one that began earlier (stops ``a`` and ``baa`` on ``b|a|a`` cut before the
``b``), which is why a complete hit is held while an earlier partial one is still open.
"""

from __future__ import annotations

from collections.abc import Iterable


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
        hold = self._open_prefix(pending)
        hit = self._first_hit(pending)
        if hit is not None and (not hold or len(pending) - hold >= hit):
            self._pending = ""
            return pending[:hit], True
        cut = len(pending) - hold
        self._pending = pending[cut:]
        return pending[:cut], False

    feed = push

    def flush(self) -> str:
        """The held-back text once the stream has ended, cut before a stop it holds complete."""
        return self.finish()[0]

    def finish(self) -> tuple[str, bool]:
        """(the held-back text cut before a stop it holds complete, whether it held one). A stop
        can be complete yet held: in ``cb`` with stops ``b`` and ``cbx``, the earlier ``cbx`` could
        still come, until the stream ends."""
        text, self._pending = self._pending, ""
        hit = self._first_hit(text)
        return (text, False) if hit is None else (text[:hit], True)

    def _first_hit(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self._stops) if i >= 0]
        return min(hits) if hits else None

    def _open_prefix(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of some stop."""
        hold = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(text)), hold, -1):
                if text.endswith(stop[:k]):
                    hold = k
                    break
        return hold
