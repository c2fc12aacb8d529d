"""Incremental decoding of a call-or-reply answer (:mod:`localrun.chat.tool_reply`).

:class:`ReplyUnwrapper` reads the wrapper's JSON one character at a time as it is generated:
``{"response": "…"}`` streams the string's decoded characters as they arrive (escapes, and
``\\uXXXX`` surrogate pairs whose halves land in different pieces, are held until complete);
any other object (a call) is held whole and parsed at the end. An answer that is not a JSON
object at all (no grammar held the model) streams through as it is, so nothing is lost.

:class:`ThinkGate` lets a reasoning model's ``<think>…</think>`` block through untouched before
the wrapper starts, as the grammar allows it. Pure Python.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ReplyUnwrapper", "ThinkGate"]

_WS = " \t\n\r"
_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_BAD = "\ufffd"  # a lone surrogate has no UTF-8 form: it becomes the replacement character

# The reader's states, in the order an answer goes through them.
_LEAD, _KEY_OPEN, _KEY, _COLON, _VALUE, _STRING, _TAIL = range(7)
_HELD, _RAW = 7, 8


class ReplyUnwrapper:
    """Feeds an answer's text, returns the reply's decoded characters; ``finish`` parses a held call."""

    __slots__ = ("_esc", "_high", "_key", "_raw", "_state")

    def __init__(self) -> None:
        self._state = _LEAD
        self._raw: list[str] = []  # every character of the answer, for a held object or a non-JSON answer
        self._key: list[str] = []
        self._esc = ""  # an escape begun in the string and not yet complete ("\\", "\\u00")
        self._high: int | None = None  # a high surrogate waiting for its low half

    def feed(self, text: str) -> str:
        out: list[str] = []
        for ch in text:
            self._step(ch, out)
        return "".join(out)

    def finish(self) -> tuple[Any, str]:
        """(the held JSON object or None, the held text). A streamed reply, or a non-JSON
        answer already passed through, holds nothing: ``(None, "")``. A held object that does
        not parse (cut by the length limit or a stop string): ``(None, its text)``."""
        if self._state != _HELD and self._state not in (_KEY_OPEN, _KEY, _COLON, _VALUE):
            return None, ""
        raw = "".join(self._raw)
        try:
            return json.loads(raw), raw
        except ValueError:
            return None, raw

    def _step(self, ch: str, out: list[str]) -> None:
        state = self._state
        if state == _RAW:
            out.append(ch)
        elif state != _TAIL:
            self._raw.append(ch)
            if state == _STRING:
                self._string(ch, out)
            elif state != _HELD and (state == _KEY or ch not in _WS):
                self._envelope(ch, out)

    def _envelope(self, ch: str, out: list[str]) -> None:
        """One character of ``{"key":`` before the value (whitespace outside the key skipped)."""
        state = self._state
        if state == _LEAD:
            if ch == "{":
                self._state = _KEY_OPEN
            else:  # not the wrapper: everything is content
                out.append("".join(self._raw))
                self._raw.clear()
                self._state = _RAW
        elif state == _KEY_OPEN:
            self._state = _KEY if ch == '"' else _HELD
        elif state == _KEY:
            if ch == '"':
                self._state = _COLON
            elif ch == "\\":
                self._state = _HELD
            else:
                self._key.append(ch)
        elif state == _COLON:
            self._state = _VALUE if ch == ":" else _HELD
        elif state == _VALUE:
            reply = ch == '"' and "".join(self._key) == "response"
            self._state = _STRING if reply else _HELD

    def _emit(self, text: str, out: list[str]) -> None:
        if self._high is not None:
            out.append(_BAD)
            self._high = None
        out.append(text)

    def _string(self, ch: str, out: list[str]) -> None:
        if not self._esc:
            if ch == "\\":
                self._esc = ch
            elif ch == '"':
                self._emit("", out)
                self._state = _TAIL
            else:
                self._emit(ch, out)
            return
        self._esc += ch
        if len(self._esc) == 2 and ch != "u":
            self._esc = ""
            self._emit(_SIMPLE.get(ch, ch), out)
        elif len(self._esc) == 6:
            digits, self._esc = self._esc[2:], ""
            try:
                code = int(digits, 16)
            except ValueError:
                self._emit(_BAD, out)
                return
            self._code_unit(code, out)

    def _code_unit(self, code: int, out: list[str]) -> None:
        if 0xD800 <= code < 0xDC00:
            self._emit("", out)  # an earlier high half without its low half
            self._high = code
        elif 0xDC00 <= code < 0xE000:
            if self._high is None:
                out.append(_BAD)
            else:
                out.append(chr(0x10000 + ((self._high - 0xD800) << 10) + (code - 0xDC00)))
                self._high = None
        else:
            self._emit(chr(code), out)


_OPEN, _CLOSE = "<think>", "</think>"
_ANSWER, _THINKING, _UNDECIDED = "answer", "thinking", "undecided"


class ThinkGate:
    """Splits a reasoning block off the front of an answer: ``feed`` returns (reasoning text to
    pass through as written, answer text). ``mode``: ``open`` (the prompt opened the block),
    ``optional`` (a block may come first) or None (no reasoning)."""

    __slots__ = ("_buf", "_state")

    def __init__(self, mode: str | None) -> None:
        self._state = _ANSWER if mode is None else _THINKING if mode == "open" else _UNDECIDED
        self._buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        if self._state == _ANSWER:
            return "", text
        self._buf += text
        if self._state == _UNDECIDED:
            lead = self._buf.lstrip()
            if lead.startswith(_OPEN):
                self._state = _THINKING
            elif not lead or _OPEN.startswith(lead):
                return "", ""
            else:
                self._state = _ANSWER
                return "", self._buf_take()
        at = self._buf.find(_CLOSE)
        if at >= 0:
            end = at + len(_CLOSE)
            passed, rest = self._buf[:end], self._buf[end:]
            self._buf, self._state = "", _ANSWER
            return passed, rest
        hold = next((k for k in range(len(_CLOSE) - 1, 0, -1) if self._buf.endswith(_CLOSE[:k])), 0)
        passed, self._buf = self._buf[: len(self._buf) - hold], self._buf[len(self._buf) - hold :]
        return passed, ""

    def _buf_take(self) -> str:
        buf, self._buf = self._buf, ""
        return buf

    def finish(self) -> tuple[str, str]:
        """What is still held: reasoning cut short passes through; an undecided start is answer."""
        buf = self._buf_take()
        return (buf, "") if self._state == _THINKING else ("", buf)
