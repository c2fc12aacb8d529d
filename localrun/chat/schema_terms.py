"""The terminal pieces of a JSON Schema grammar: JSON's own primitives, integer and decimal
ranges written as digit grammars, and string formats.

Everything here is a GBNF expression that matches a *subset* of the values the keyword allows
(never a value it forbids), and never the empty set. A range ``[lo, hi]`` of integers is the
classic digit-by-digit decomposition: for equal-length bounds, the common leading digits, then
"first digit at its bound, the rest recursively" on either side and a free middle; lengths in
between are ``[1-9] [0-9]{L-1}``. Decimal bounds must be whole numbers (``minimum: 0,
maximum: 1`` for a probability is fine; ``minimum: 0.5`` is refused by the converter).
"""

from __future__ import annotations

import json

#: JSON's primitives as llama.cpp's converter writes them (facts: common/json-schema-to-grammar.cpp),
#: except whitespace: one optional space between tokens (as llama-cpp-python's converter has it),
#: so a small model cannot spend its tokens on newlines and indentation.
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "space": ('" "?', ()),
    "boolean": ('("true" | "false") space', ("space",)),
    "null": ('"null" space', ("space",)),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integer": ('("-"? integral-part) space', ("integral-part", "space")),
    "number": (
        '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space',
        ("integral-part", "decimal-part", "space"),
    ),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt/] | "u" [0-9a-fA-F]{4})', ()),
    # One code point of a length-bounded string: no \\u escapes (a surrogate pair is two of them).
    "char1": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] ["\\\\bfnrt/]', ()),
    "string": ('"\\"" char* "\\"" space', ("char", "space")),
    "value": (
        "object | array | string | number | boolean | null",
        ("object", "array", "string", "number", "boolean", "null"),
    ),
    "object": (
        '"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space',
        ("string", "space", "value"),
    ),
    "array": ('"[" space ( value ("," space value)* )? "]" space', ("value", "space")),
}

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def json_literal(value: object) -> str:
    """A JSON value's compact text as a GBNF literal (enum and const)."""
    return gbnf_literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _digits(lo: int, hi: int) -> str:
    return f"[{lo}]" if lo == hi else f"[{lo}-{hi}]"


def _same_length(lo: str, hi: str) -> str:
    """Decimal strings of ``len(lo)`` digits from ``lo`` to ``hi`` (equal lengths, lo <= hi)."""
    if not lo:
        return ""
    if lo == hi:
        return gbnf_literal(lo)
    if lo[0] == hi[0]:
        return f"{gbnf_literal(lo[0])} ({_same_length(lo[1:], hi[1:])})"
    rest = len(lo) - 1
    tail = f" [0-9]{{{rest}}}" if rest else ""
    lo_full = all(c == "0" for c in lo[1:])
    hi_full = all(c == "9" for c in hi[1:])
    first = int(lo[0]) if lo_full else int(lo[0]) + 1
    last = int(hi[0]) if hi_full else int(hi[0]) - 1
    parts = []
    if not lo_full:
        parts.append(f"{gbnf_literal(lo[0])} ({_same_length(lo[1:], '9' * rest)})")
    if first <= last:
        parts.append(_digits(first, last) + tail)
    if not hi_full:
        parts.append(f"{gbnf_literal(hi[0])} ({_same_length('0' * rest, hi[1:])})")
    return " | ".join(parts)


#: Digits of an unbounded integer (llama.cpp's integral-part allows 16).
MAX_DIGITS = 16


def repeat(item: str, lo: int, hi: int | None, cap: int) -> str:
    """``item`` between ``lo`` and ``hi`` times (None: no upper bound), every count in the GBNF at
    most ``cap`` (llama.cpp's own repetition limit), however large the bounds: a count over the
    cap is written as blocks of ``k`` items counted again, ``k`` about its square root. Exact for
    every length, and unambiguous enough that the grammar engine keeps a few stacks at a time.
    Bounds up to ``cap²`` (4,000,000 for llama.cpp): a string's ``maxLength: 524288`` (Claude
    Code's Workflow tool) is kept, not refused."""
    if hi is not None and hi <= cap:
        return f"{item}{{{lo}}}" if lo == hi else f"{item}{{{lo},{hi}}}"
    head = _exactly(item, lo, cap)
    tail = f"{item}*" if hi is None else _at_most(item, hi - lo, cap)
    return f"{head} {tail}" if head else tail


def _blocks(n: int) -> tuple[int, int, int]:
    k = 1
    while k * k < n:
        k += 1
    q, r = divmod(n, k)
    return k, q, r


def _exactly(item: str, n: int, cap: int) -> str:
    if n <= cap:
        return f"{item}{{{n}}}" if n else ""
    k, q, r = _blocks(n)
    return f"({item}{{{k}}}){{{q}}}" + (f" {item}{{{r}}}" if r else "")


def _at_most(item: str, n: int, cap: int) -> str:
    if n <= cap:
        return f"{item}{{0,{n}}}"
    k, q, r = _blocks(n)  # 0 … q·k-1 as whole blocks then fewer than k; q·k … n as q blocks then up to r
    below = (f"({item}{{{k}}}){{0,{q - 1}}} " if q > 1 else "") + f"{item}{{0,{k - 1}}}"
    top = f"({item}{{{k}}}){{{q}}}" + (f" {item}{{0,{r}}}" if r else "")
    return f"(({below}) | ({top}))"


def uint_range(a: int, b: int | None) -> str:
    """Canonical decimals ``n`` with ``a <= n <= b`` (``b`` None: no upper bound); a <= b, a >= 0."""
    la = len(str(a))
    parts = []
    top = len(str(b)) if b is not None else la
    for length in range(la, top + 1):
        lo = str(a) if length == la else "1" + "0" * (length - 1)
        hi = str(b) if b is not None and length == top else "9" * length
        parts.append(_same_length(lo, hi))
    if b is None and la < MAX_DIGITS:
        parts.append(f"[1-9] [0-9]{{{la},{MAX_DIGITS - 1}}}")
    return "(" + " | ".join(f"({p})" for p in parts) + ")"


def int_range(lo: int | None, hi: int | None) -> str:
    """Integers with ``lo <= n <= hi`` (None: unbounded on that side); lo <= hi."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(uint_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        smallest = 1 if hi is None or hi >= 0 else -hi
        parts.append('"-" ' + uint_range(smallest, -lo if lo is not None else None))
    return "(" + " | ".join(parts) + ")"


def _fraction(digits: int) -> str:
    return f'"." [0-9]{{1,{digits}}}'


def _magnitudes(a: int, a_excl: bool, b: int | None, b_excl: bool, digits: int) -> list[str]:
    """Non-negative decimals m with a <(=) m <(=) b; a, b whole numbers."""
    if b is not None and (b < a or (b == a and (a_excl or b_excl))):
        return []
    frac = f"({_fraction(digits)})?"
    nonzero_frac = f'"." [0-9]{{0,{digits - 1}}} [1-9]' if digits > 1 else '"." [1-9]'
    parts = []
    start = a
    if a_excl:
        parts.append(f"{gbnf_literal(str(a))} {nonzero_frac}")
        start = a + 1
    end = None if b is None else b - 1
    if end is None or start <= end:
        parts.append(f"{uint_range(start, end)} {frac}")
    if b is not None and not b_excl and (b > a or not a_excl):
        parts.append(f'{gbnf_literal(str(b))} ("." "0")?')
    return parts


def number_range(lo: int | None, lo_excl: bool, hi: int | None, hi_excl: bool, digits: int) -> str | None:
    """Decimals (no exponent, at most ``digits`` after the point) between whole-number bounds;
    None when no number fits."""
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        if lo is not None and lo >= 0:
            parts += _magnitudes(lo, lo_excl, hi, hi_excl, digits)
        else:
            parts += _magnitudes(0, False, hi, hi_excl, digits)
    if lo is None or lo < 0:
        if hi is not None and hi < 0:
            low, low_excl = -hi, hi_excl
        else:
            low, low_excl = 0, True
        neg = _magnitudes(low, low_excl, None if lo is None else -lo, lo_excl, digits)
        parts += [f'"-" {p}' for p in neg]
    if not parts:
        return None
    return "(" + " | ".join(f"({p})" for p in parts) + ")"


_MONTH_DAY = (
    '(("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])'
    ' | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30")'
    ' | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8]))'
)
_DATE = f'[1-9] [0-9]{{3}} "-" {_MONTH_DAY}'
_TIME = (
    '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})?'
    ' ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])'
)
_HEX = "[0-9a-f]"
_LABEL = "[a-z0-9] ([a-z0-9-]{0,61} [a-z0-9])?"
_OCTET = '("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9]{2} | [1-9]? [0-9])'

#: String formats, each the text between the quotes. Dates stop at the 28th of February (every
#: year has it) rather than teach a grammar leap years.
FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f'{_DATE} "T" {_TIME}',
    "uuid": f'{_HEX}{{8}} "-" {_HEX}{{4}} "-" {_HEX}{{4}} "-" {_HEX}{{4}} "-" {_HEX}{{12}}',
    "email": f'[a-zA-Z0-9_+-]{{1,32}} ("." [a-zA-Z0-9_+-]{{1,32}}){{0,3}} "@" {_LABEL} ("." {_LABEL}){{1,3}}',
    "hostname": f'{_LABEL} ("." {_LABEL}){{0,5}}',
    "ipv4": f'{_OCTET} "." {_OCTET} "." {_OCTET} "." {_OCTET}',
    "uri": '("https" | "http") "://" '
    + f'{_LABEL} ("." {_LABEL}){{0,5}}'
    + ' ("/" [a-zA-Z0-9._~%!$&()*+,;=:@/?-]{0,200})?',
}
