"""The chat's sampling fields (temp, top_p, max): a stray key can never empty one and block
every send.

Only what makes a number can be typed (a letter is refused with a note saying what the field
takes); a field left empty or out of range goes back to its last good value when it loses
the focus (or when a message is sent), and a note says which value was kept.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from textual.widgets import Input

if TYPE_CHECKING:
    from textual import events

log = logging.getLogger(__name__)


class SamplingKnob(Input):
    """A number between ``lo`` and ``hi`` that always holds a good value for the next send."""

    def __init__(self, value: str, *, what: str, lo: float, hi: float, integer: bool = False, id: str) -> None:
        super().__init__(value, type="integer" if integer else "number", id=id, classes="knob")
        self.what, self.lo, self.hi, self.integer = what, lo, hi, integer
        self.last_good = value

    @property
    def range_text(self) -> str:
        lo, hi = (f"{int(v):,}" if self.integer else f"{v:g}" for v in (self.lo, self.hi))
        return f"{'a whole number' if self.integer else 'a number'} from {lo} to {hi}"

    def _problem(self, text: str) -> str | None:
        """Why ``text`` is no value for this field, or None when it is one."""
        if not text:
            return "was left empty"
        try:
            value = int(text) if self.integer else float(text)
        except ValueError:
            return f"{text!r} is not a number"
        if not self.lo <= value <= self.hi:
            return f"{text} is out of range"
        return None

    def settle(self) -> str:
        """The field's value for a send: what it holds if good, else the last good value, put back, with a note."""
        text = self.value.strip()
        problem = self._problem(text)
        if problem is None:
            self.last_good = text
            return text
        self.value = self.last_good
        self.notify(
            f"{self.what} {problem}: kept {self.last_good} (it takes {self.range_text})",
            title="Settings",
            severity="warning",
            timeout=4,
        )
        return self.last_good

    def restricted(self) -> None:
        """A key that cannot make a number is not typed, and the user is told why (no silent bell)."""
        self.notify(f"{self.what} takes {self.range_text}", title="Settings", severity="warning", timeout=3)

    def on_blur(self, _event: events.Blur) -> None:
        self.settle()

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self.settle()
