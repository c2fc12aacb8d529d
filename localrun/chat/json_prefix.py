"""A JSON text read one character at a time: whether it is still a prefix of valid JSON, and
where its values start and end.

:mod:`localrun.chat.tool_stream` streams a tool call's arguments while the model writes them;
every piece it sends must keep the arguments a prefix of valid JSON, and it must know where the
call's name and arguments begin and end without waiting for the whole answer. ``json`` parses
whole texts only, so this is a small state machine (RFC 8259's grammar, nothing more lenient):
:meth:`JsonScan.push` takes the next character and says which values started or ended with it.
Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JsonScan", "ScanEvent"]

_WS = " \t\n\r"
_DIGITS = "0123456789"
_HEX = "0123456789abcdefABCDEF"
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
#: Number states a number may end in (after ``-`` or ``.`` or ``e`` it may not).
_NUMBER_ENDS = frozenset({"zero", "int", "frac", "exp"})


@dataclass(frozen=True)
class ScanEvent:
    """A value started (``start``: at ``pos``) or ended (``end``: just before ``pos``), or an object
    key ended (``key``: its text from ``start`` to just before ``pos``), ``depth`` containers deep."""

    kind: str
    depth: int
    pos: int
    start: int = -1


class JsonScan:
    """One JSON value, checked as it grows. ``bad`` once a character broke it; ``done`` once it ended."""

    __slots__ = ("stack", "state", "_in_key", "_key_start", "_rest", "_num")

    def __init__(self) -> None:
        self.stack: list[str] = []  # "o" / "a" per open container
        self.state = "value"
        self._in_key = False
        self._key_start = -1
        self._rest = ""  # a literal's letters still to come, or a \\u escape's hex digits ("xxxx")
        self._num = ""

    @property
    def bad(self) -> bool:
        return self.state == "bad"

    @property
    def done(self) -> bool:
        return self.state == "done"

    def finish_number(self, pos: int) -> list[ScanEvent]:
        """The end of the text after a top-level number (which only a following character could end)."""
        if self.state == "number" and self._num in _NUMBER_ENDS:
            return self._ended(pos)
        return []

    def push(self, ch: str, pos: int) -> list[ScanEvent]:
        """Read ``ch`` (at ``pos`` in the text); the events it caused. A bad character makes ``bad`` true."""
        state = self.state
        if state in ("string", "escape", "unicode"):
            return self._string(ch, pos)
        if state == "number":
            return self._number(ch, pos)
        if state == "literal":
            if ch != self._rest[0]:
                self.state = "bad"
                return []
            self._rest = self._rest[1:]
            return [] if self._rest else self._ended(pos + 1)
        return self._structure(ch, pos)

    def _string(self, ch: str, pos: int) -> list[ScanEvent]:
        state = self.state
        if state == "escape":
            if ch == "u":
                self.state, self._rest = "unicode", "xxxx"
            else:
                self.state = "string" if ch in '"\\/bfnrt' else "bad"
        elif state == "unicode":
            self._rest = self._rest[1:]
            self.state = "bad" if ch not in _HEX else "unicode" if self._rest else "string"
        elif ch == '"':
            if self._in_key:
                self.state = "colon"
                return [ScanEvent("key", len(self.stack), pos + 1, self._key_start)]
            return self._ended(pos + 1)
        elif ch == "\\":
            self.state = "escape"
        elif ch < " ":
            self.state = "bad"
        return []

    def _structure(self, ch: str, pos: int) -> list[ScanEvent]:
        state = self.state
        if ch in _WS:
            return []
        if state in ("value", "value_or_close"):
            if ch == "]" and state == "value_or_close":
                self.stack.pop()
                return self._ended(pos + 1)
            return self._value(ch, pos)
        if state in ("key_or_close", "key"):
            if ch == "}" and state == "key_or_close":
                self.stack.pop()
                return self._ended(pos + 1)
            if ch == '"':
                self.state, self._in_key, self._key_start = "string", True, pos
            else:
                self.state = "bad"
            return []
        if state == "colon":
            self.state = "value" if ch == ":" else "bad"
            return []
        if state == "after":
            top = self.stack[-1]
            if ch == ",":
                self.state = "key" if top == "o" else "value"
                return []
            if ch == ("}" if top == "o" else "]"):
                self.stack.pop()
                return self._ended(pos + 1)
        self.state = "bad"  # "done" takes nothing more either
        return []

    def _value(self, ch: str, pos: int) -> list[ScanEvent]:
        start = [ScanEvent("start", len(self.stack), pos)]
        if ch == "{":
            self.stack.append("o")
            self.state = "key_or_close"
        elif ch == "[":
            self.stack.append("a")
            self.state = "value_or_close"
        elif ch == '"':
            self.state, self._in_key = "string", False
        elif ch == "-" or ch in _DIGITS:
            self.state = "number"
            self._num = "minus" if ch == "-" else "zero" if ch == "0" else "int"
        elif ch in _LITERALS:
            self.state, self._rest = "literal", _LITERALS[ch]
        else:
            self.state = "bad"
            return []
        return start

    def _number(self, ch: str, pos: int) -> list[ScanEvent]:
        num, digit = self._num, ch in _DIGITS
        step = {
            "minus": "int" if digit and ch != "0" else "zero" if ch == "0" else None,
            "zero": "dot" if ch == "." else "e" if ch in "eE" else None,
            "int": "int" if digit else "dot" if ch == "." else "e" if ch in "eE" else None,
            "dot": "frac" if digit else None,
            "frac": "frac" if digit else "e" if ch in "eE" else None,
            "e": "esign" if ch in "+-" else "exp" if digit else None,
            "esign": "exp" if digit else None,
            "exp": "exp" if digit else None,
        }[num]
        if step is not None:
            self._num = step
            return []
        if num not in _NUMBER_ENDS:
            self.state = "bad"
            return []
        ended = self._ended(pos)  # the character after a number ends it, and is read on its own
        return ended + self.push(ch, pos)

    def _ended(self, pos: int) -> list[ScanEvent]:
        self.state = "after" if self.stack else "done"
        return [ScanEvent("end", len(self.stack), pos)]
