"""What decode calls cost on this machine: plain steps by rows, verification passes by
rows, a draft model's steps; measured as the scheduler runs and timed at load
(:func:`.step.calibrate`). The drafting policy (:mod:`.drafting`) reads them."""

from __future__ import annotations

import bisect


class DecodeCosts:
    """Measured seconds of decode calls: plain steps by rows (one row per sequence) and
    passes of one sequence by rows. Between measured row counts a pass's cost is read off
    the line through its neighbours; beyond the largest, the last two extend the line;
    before any pass is measured, each extra row is ``PRIOR_EXTRA`` of a one-row step."""

    PRIOR_EXTRA = 0.35
    #: A draft model's step before one is timed, in one-row steps of the target.
    PRIOR_DRAFT = 0.25

    def __init__(self) -> None:
        self.plain: dict[int, float] = {}
        self.passes: dict[int, float] = {}
        self._known: list[int] = [1]
        self.draft_step: float | None = None  # seconds per draft-model step (all its sequences at once)
        #: How far a pass's logits round from a one-row step's (the best few), measured at load.
        self.rounding = 0.0

    def observe_draft(self, seconds: float, steps: int) -> None:
        if steps > 0:
            self.draft_step = ewma(self.draft_step, seconds / steps)

    def draft_token(self) -> float | None:
        """Seconds a draft model's token costs a sequence (None: no plain step timed yet)."""
        if self.draft_step is not None:
            return self.draft_step
        one = self.plain.get(1)
        return None if one is None else self.PRIOR_DRAFT * one

    def observe_plain(self, rows: int, seconds: float) -> None:
        self.plain[rows] = ewma(self.plain.get(rows), seconds)

    def observe_verify(self, rows: int, seconds: float) -> None:
        if rows >= 2:
            self.passes[rows] = ewma(self.passes.get(rows), seconds)

    def share(self, rows: int) -> float | None:
        """Seconds one sequence costs in a plain step of ``rows`` sequences."""
        got = self.plain.get(rows)
        if got is None:
            near = [r for r in self.plain if r <= rows]
            if not near:
                return None
            got = self.plain[max(near)]
            rows = max(near)
        return got / rows

    def verify(self, rows: int) -> float | None:
        """Seconds a pass of ``rows`` rows of one sequence is expected to take."""
        one = self.plain.get(1)
        if one is None:
            return None
        if rows <= 1:
            return one
        got = self.passes.get(rows)
        if got is not None:
            return got
        points = self.passes
        known = self._known if len(self._known) == len(points) + 1 else self._sort()
        at = bisect.bisect_left(known, rows)
        below = known[at - 1]
        low = one if below == 1 else points[below]
        if at < len(known):
            hi = known[at]
            return low + (points[hi] - low) * (rows - below) / (hi - below)
        if len(known) >= 2:
            lo = known[-2]
            slope = max(0.0, (low - (one if lo == 1 else points[lo])) / (below - lo))
        else:
            slope = self.PRIOR_EXTRA * one
        return low + slope * (rows - below)

    def _sort(self) -> list[int]:
        """The measured row counts in order (1: the plain step), kept until a new size is timed:
        :meth:`verify` runs for every pass size a sequence could take, at every step."""
        self._known = sorted((1, *self.passes))
        return self._known


def ewma(old: float | None, new: float, alpha: float = 0.2) -> float:
    return new if old is None else old + alpha * (new - old)
