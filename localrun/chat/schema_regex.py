"""A JSON Schema ``pattern`` (an ECMA-262 regular expression) as GBNF for the string's text.

The subset that a context-free grammar can say: literals and escapes (``\\n \\t \\xHH \\uHHHH``,
escaped metacharacters), classes ``[...]`` and ``[^...]`` with ranges, ``\\d \\w \\s`` and their
negations, ``.``, groups ``(...)`` ``(?:...)`` ``(?<name>...)``, alternation, quantifiers ``* + ?
{n} {n,} {n,m}`` (lazy forms match the same strings), and ``^``/``$`` at the ends of an
alternative. A pattern without ``^`` may start anywhere in the string and one without ``$`` may
end anywhere: the grammar adds free text around it, as JSON Schema's unanchored matching means.
Refused by name: lookahead and lookbehind, backreferences, ``\\b``/``\\B``, ``\\p{...}``,
``\\cX``, inline flags, anchors inside the pattern.

The grammar writes the string as JSON text, so a character the pattern allows that JSON must
escape (``"``, ``\\``, control characters) is written escaped; control characters other than
``\\n \\r \\t`` are left out (a subset of the pattern's strings, never a string outside it).
"""

from __future__ import annotations

from collections.abc import Callable

from localrun.chat.schema_terms import gbnf_literal

MAX_CODEPOINT = 0x10FFFF
MAX_PATTERN = 4096
MAX_NESTING = 32

Ranges = list[tuple[int, int]]
_DIGIT: Ranges = [(0x30, 0x39)]
_WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE: Ranges = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029)]
_SPACE += [(0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
_NEWLINES: Ranges = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]
_CLASSES = {"d": (_DIGIT, False), "D": (_DIGIT, True), "w": (_WORD, False), "W": (_WORD, True)}
_CLASSES |= {"s": (_SPACE, False), "S": (_SPACE, True)}
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
#: Characters JSON writes escaped, and how; every other control character is left out.
_JSON_ESCAPED = {0x22: '\\"', 0x5C: "\\\\", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
_PLAIN_EXCLUDED: Ranges = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]


class PatternError(ValueError):
    """A pattern outside the subset; the message names the construct."""


def normalise(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def complement(ranges: Ranges) -> Ranges:
    out: Ranges = []
    nxt = 0
    for lo, hi in normalise(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return out


def class_char(cp: int) -> str:
    """One code point as GBNF writes it inside ``[...]``."""
    if cp < 0x20 or cp == 0x7F or cp == 0x5E or 0xD800 <= cp <= 0xDFFF:  # ^: GBNF has no \\^ escape
        return f"\\x{cp:02X}" if cp < 0x100 else f"\\u{cp:04X}"
    ch = chr(cp)
    return "\\" + ch if ch in '\\]-["' else ch


def class_gbnf(ranges: Ranges) -> str | None:
    """GBNF for one character of ``ranges`` written as JSON string text; None if none can be."""
    ranges = normalise(ranges)
    plain = normalise([r for r in _intersect(ranges, complement(_PLAIN_EXCLUDED))])
    parts = []
    if plain:
        if len(plain) > 8 and len(complement(plain)) < len(plain):
            body = "".join(_range_text(lo, hi) for lo, hi in complement(plain))
            parts.append(f"[^{body}]")
        else:
            parts.append("[" + "".join(_range_text(lo, hi) for lo, hi in plain) + "]")
    for cp, esc in _JSON_ESCAPED.items():
        if any(lo <= cp <= hi for lo, hi in ranges):
            parts.append(gbnf_literal(esc))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


def _range_text(lo: int, hi: int) -> str:
    return class_char(lo) if lo == hi else f"{class_char(lo)}-{class_char(hi)}"


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return out


class _Regex:
    """Recursive descent over the pattern; each node's GBNF, and whether it can match ''."""

    def __init__(self, pattern: str, max_repeat: int) -> None:
        self.p, self.i, self.max_repeat = pattern, 0, max_repeat

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def alternation(self, depth: int, top: bool) -> tuple[str, bool]:
        alts = [self.sequence(depth, top)]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence(depth, top))
        if len(alts) == 1:
            return alts[0]
        return "(" + " | ".join(g or '""' for g, _ in alts) + ")", any(e for _, e in alts)

    def sequence(self, depth: int, top: bool) -> tuple[str, bool]:
        parts: list[str] = []
        empty = True
        anchored_start = anchored_end = False
        if top and self.peek() == "^":
            self.i += 1
            anchored_start = True
        while self.peek() not in ("", "|", ")"):
            if self.peek() == "$" and top and self.p[self.i + 1 : self.i + 2] in ("", "|"):
                self.i += 1
                anchored_end = True
                break
            atom, atom_empty = self.quantified(depth)
            parts.append(atom)
            empty = empty and atom_empty
        if top:
            if not anchored_start:
                parts.insert(0, "char*")
            if not anchored_end:
                parts.append("char*")
        return " ".join(parts), empty

    def quantified(self, depth: int) -> tuple[str, bool]:
        atom, empty = self.atom(depth)
        q = self.quantifier()
        if q is None:
            return atom, empty
        lo, hi = q
        if self.peek() == "?":
            self.i += 1  # lazy: the same strings
        if empty and hi != 1:
            raise PatternError("a repeated part that can match the empty string")
        bound = "" if hi == lo else str(hi) if hi >= 0 else ""
        text = f"({atom}){{{lo}}}" if hi == lo else f"({atom}){{{lo},{bound}}}"
        return text, empty or lo == 0

    def quantifier(self) -> tuple[int, int] | None:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            return {"*": (0, -1), "+": (1, -1), "?": (0, 1)}[c]
        if c != "{":
            return None
        end = self.p.find("}", self.i)
        body = self.p[self.i + 1 : end] if end > 0 else ""
        lo_text, comma, hi_text = body.partition(",")
        if not lo_text.isdigit() or (hi_text and not hi_text.isdigit()):
            return None  # a literal brace, as ECMA's annex B reads it
        lo, hi = int(lo_text), (int(hi_text) if hi_text else -1) if comma else int(lo_text)
        if max(lo, hi) > self.max_repeat:
            raise PatternError(f"a repetition count of {max(lo, hi)} (the limit is {self.max_repeat})")
        if hi >= 0 and hi < lo:
            raise PatternError(f"a repetition {{{body}}} with its maximum below its minimum")
        self.i = end + 1
        return lo, hi

    def atom(self, depth: int) -> tuple[str, bool]:
        c = self.peek()
        self.i += 1
        if c == "(":
            return self.group(depth)
        if c == "[":
            return self.char_class(), False
        if c == ".":
            return self.emit(complement(_NEWLINES)), False
        if c == "\\":
            return self.emit(self.escape(in_class=False)), False
        if c in ("*", "+", "?"):
            raise PatternError(f"a quantifier {c!r} with nothing to repeat")
        if c in ("^", "$", ")"):
            raise PatternError(f"an anchor {c!r} inside the pattern" if c != ")" else "an unmatched ')'")
        return self.emit([(ord(c), ord(c))]), False

    def group(self, depth: int) -> tuple[str, bool]:
        if depth >= MAX_NESTING:
            raise PatternError(f"groups nested deeper than {MAX_NESTING}")
        rest = self.p[self.i :]
        for look in ("?=", "?!", "?<=", "?<!"):
            if rest.startswith(look):
                raise PatternError(f"a lookaround group '({look}'")
        if rest.startswith("?:"):
            self.i += 2
        elif rest.startswith("?<"):
            self.i = self.p.index(">", self.i) + 1 if ">" in rest else len(self.p)
        elif rest.startswith("?"):
            raise PatternError("an inline flag group '(?'")
        inner, empty = self.alternation(depth + 1, top=False)
        if self.peek() != ")":
            raise PatternError("an unclosed group")
        self.i += 1
        return f"({inner or chr(34) * 2})", empty

    def emit(self, ranges: Ranges) -> str:
        out = class_gbnf(ranges)
        if out is None:
            raise PatternError("a character class that no JSON string character matches")
        return out

    def escape(self, *, in_class: bool) -> Ranges:
        c = self.peek()
        self.i += 1
        if not c:
            raise PatternError("a trailing backslash")
        if c in _CLASSES:
            ranges, negated = _CLASSES[c]
            return complement(ranges) if negated else list(ranges)
        if c in _SIMPLE:
            return [(ord(_SIMPLE[c]), ord(_SIMPLE[c]))]
        if c in ("x", "u"):
            n = 2 if c == "x" else 4
            digits = self.p[self.i : self.i + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise PatternError(f"a \\{c} escape without {n} hex digits")
            self.i += n
            return [(int(digits, 16), int(digits, 16))]
        if c == "b" and in_class:
            return [(8, 8)]
        if c in "bB":
            raise PatternError(f"a word boundary '\\{c}'")
        if c in "pP":
            raise PatternError(f"a Unicode property escape '\\{c}{{...}}'")
        if c.isdigit() or c == "k":
            raise PatternError(f"a backreference '\\{c}'")
        if c.isalnum():
            raise PatternError(f"the escape '\\{c}'")
        return [(ord(c), ord(c))]

    def char_class(self) -> str:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: Ranges = []
        first = True
        while True:
            c = self.peek()
            if not c:
                raise PatternError("an unclosed character class")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self.class_atom()
            if self.peek() == "-" and self.p[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self.class_atom()
                if len(lo) != 1 or len(hi) != 1 or lo[0][0] != lo[0][1] or hi[0][0] != hi[0][1]:
                    raise PatternError("a range between character classes")
                if hi[0][0] < lo[0][0]:
                    raise PatternError(f"an inverted range {chr(lo[0][0])}-{chr(hi[0][0])}")
                ranges.append((lo[0][0], hi[0][0]))
            else:
                ranges.extend(lo)
        return self.emit(complement(ranges) if negated else ranges)

    def class_atom(self) -> Ranges:
        c = self.peek()
        self.i += 1
        if c == "\\":
            return self.escape(in_class=True)
        return [(ord(c), ord(c))]


def pattern_gbnf(pattern: str, *, max_repeat: int, error: Callable[[str], Exception]) -> str:
    """GBNF for the text between a JSON string's quotes matching ``pattern`` (uses rule ``char``).

    Raises:
        whatever ``error(message)`` makes, naming the construct outside the subset.
    """
    if len(pattern) > MAX_PATTERN:
        raise error(f"a pattern of {len(pattern)} characters (the limit is {MAX_PATTERN})")
    parser = _Regex(pattern, max_repeat)
    try:
        text, _ = parser.alternation(0, top=True)
        if parser.i != len(pattern):
            raise PatternError(f"an unexpected {pattern[parser.i]!r} at position {parser.i}")
    except PatternError as exc:
        raise error(f"the pattern uses {exc}, which a grammar cannot express") from exc
    return text or '""'
