"""pydantic-core's parse of a large body, in pieces of a few milliseconds each.

A parse is one C call holding the GIL: 40-110 ms for a 43 MB body of images on a 2-core box, and
the event loop waits that long wherever the call runs. What makes such a body large is a few long
strings (base64), so :func:`from_json_in_pieces` (run in a worker thread) lifts every string literal
of :data:`LONG` bytes or more out of the text, parses the small rest (the skeleton, each long
literal replaced by a placeholder string), decodes each long literal a megabyte at a time (cut
where no escape or character is split), and puts the strings back where the placeholders are.
Between those calls the Python code of the scan lets the loop's thread in.

The value is ``pydantic_core.from_json(raw)``'s: string literals are found as a JSON lexer finds
them (outside a string, ``"`` opens one; the first ``"`` after it not escaped by an odd run of
backslashes closes it), so the skeleton is valid exactly when the body is, and each literal's text
is what the parser would make of it. Anything odd (an unclosed string, a control character in a
long one, a skeleton that does not parse) raises ValueError, and the caller falls back to its
one-call parse, which gives the real error.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import pydantic_core

#: A string literal this long (bytes, quotes included) is decoded on its own.
LONG = 64 * 1024
#: The most quotes the scan walks; past it the body is parsed in one call (a body of a million
#: short strings has no long string to lift, and walking it costs more than parsing it).
MAX_QUOTES = 100_000
#: Bytes per C call when a long literal's text is checked and decoded.
PIECE = 1 << 20


def from_json_in_pieces(raw: bytes) -> Any:
    """``pydantic_core.from_json(raw, allow_inf_nan=False)``, no single C call over a long string;
    ValueError where that would fail (and where the pieces cannot say)."""
    spans = long_strings(raw)
    if not spans:
        return pydantic_core.from_json(raw, allow_inf_nan=False)
    tag = f"\x00{secrets.token_hex(8)}:"  # no client can guess it, so no string of the body equals it
    parts: list[bytes] = []
    texts: dict[str, str] = {}
    at = 0
    for i, (start, end) in enumerate(spans):
        name = f"{tag}{i}"
        parts += (raw[at:start], json.dumps(name).encode())
        texts[name] = literal_text(raw, start, end)
        at = end + 1
    parts.append(raw[at:])
    skeleton = pydantic_core.from_json(b"".join(parts), allow_inf_nan=False)
    return put_back(skeleton, texts)


def long_strings(raw: bytes) -> list[tuple[int, int]] | None:
    """(opening quote, closing quote) of each string literal of :data:`LONG` bytes or more; None
    when the body holds more than :data:`MAX_QUOTES` quotes."""
    spans: list[tuple[int, int]] = []
    find, quotes, at = raw.find, 0, 0
    while True:
        start = find(b'"', at)
        if start < 0:
            return spans
        end = start
        while True:
            end = find(b'"', end + 1)
            quotes += 1
            if end < 0:
                raise ValueError("a string is not closed")
            if quotes > MAX_QUOTES:
                return None
            back = end - 1
            while raw[back] == 0x5C:  # stops at the opening quote at the latest
                back -= 1
            if (end - 1 - back) % 2 == 0:
                break  # not escaped: the literal ends here
        if end - start + 1 >= LONG:
            spans.append((start, end))
        at = end + 1


def literal_text(raw: bytes, start: int, end: int) -> str:
    """The text of the literal ``raw[start:end + 1]`` (quotes included), decoded a piece at a time;
    each piece ends where no escape or UTF-8 character is cut (see :func:`safe_cut`)."""
    texts: list[str] = []
    at = start + 1
    while at < end:
        cut = end if end - at <= PIECE else safe_cut(raw, at + PIECE, at, end)
        text = pydantic_core.from_json(b'"' + raw[at:cut] + b'"', allow_inf_nan=False)
        if not isinstance(text, str):  # cannot be: the piece is inside one literal
            raise ValueError("not a string")
        texts.append(text)
        at = cut
    return "".join(texts)


def safe_cut(raw: bytes, near: int, floor: int, end: int) -> int:
    """A place at or before ``near`` (after ``floor``) where a literal's text can be cut: the next
    byte starts a character (ASCII, so no UTF-8 sequence is split) and either no backslash comes in
    the six bytes before it (no escape reaches it) or it is a backslash that starts an escape (an
    even run of backslashes before it) other than the low half of a surrogate pair. ``end`` (no cut)
    where none is near."""
    for p in range(near, max(near - 64, floor), -1):
        byte = raw[p]
        if byte >= 0x80:
            continue
        if raw.rfind(b"\\", max(p - 6, 0), p) < 0:
            return p
        if byte == 0x5C and _even_run_before(raw, p) and raw[p + 1 : p + 4].lower() not in _LOW_SURROGATE:
            return p
    return end


_LOW_SURROGATE = frozenset({b"udc", b"udd", b"ude", b"udf"})


def _even_run_before(raw: bytes, p: int) -> bool:
    back = p - 1
    while raw[back] == 0x5C:
        back -= 1
    return (p - 1 - back) % 2 == 0


def put_back(data: Any, texts: dict[str, str]) -> Any:
    """``data`` with each placeholder (a value or a key) replaced by its text, in place."""
    if not isinstance(data, (dict, list)):
        return texts.get(data, data) if isinstance(data, str) else data
    stack: list[dict[Any, Any] | list[Any]] = [data]
    while stack:
        item = stack.pop()
        pairs: Any
        if isinstance(item, dict):
            if any(key in texts for key in item):  # a long key: rebuilt in order, a repeated key's last value
                rebuilt = {texts.get(key, key): value for key, value in item.items()}
                item.clear()
                item.update(rebuilt)
            pairs = item.items()
        else:
            pairs = enumerate(item)
        for key, value in pairs:
            if isinstance(value, (dict, list)):
                stack.append(value)
            elif isinstance(value, str) and value in texts:
                item[key] = texts[value]  # an existing key or index: iteration stays valid
    return data
