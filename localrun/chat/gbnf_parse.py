"""llama.cpp's GBNF syntax read in Python (``llama-grammar.cpp``'s parser, followed rule for rule:
``name ::= alternates``, literals, classes, ``.``, groups, ``* + ? {m} {m,} {m,n}``, ``#``
comments, ``<token>`` references), into :class:`Grammar`; recursion bounded by
:attr:`GbnfLimits.max_depth` and counts by ``max_repeat``. :mod:`localrun.chat.gbnf` checks the
result.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from localrun.errors import UnsupportedFeature

log = logging.getLogger(__name__)

UNBOUNDED = -1
#: Repetition operators applied to one item in a row (``x?*``); more is never needed.
MAX_STACKED = 4
#: llama.cpp's grammar parser keeps a repetition count up to this and silently drops a larger bound,
#: so a schema's counts (schema_grammar.SchemaLimits) and a raw grammar's are held to it alike.
MAX_REPEAT = 2000
MAX_CODEPOINT = 0x10FFFF


@dataclass(frozen=True)
class GbnfLimits:
    """What a grammar may cost before it reaches llama.cpp."""

    max_bytes: int = 4_000_000
    max_rules: int = 50_000
    max_depth: int = 64
    max_repeat: int = MAX_REPEAT
    max_elements: int = 8_000_000


DEFAULT_LIMITS = GbnfLimits()


@dataclass
class Item:
    """One symbol of a sequence: ``kind`` is lit (text), cls (negated, ranges), ref (name),
    group (alternates), any, tok, or rep (item, min, max)."""

    kind: str
    value: object
    lo: int = 1
    hi: int = 1


Seq = list[Item]
Alts = list[Seq]


@dataclass
class Grammar:
    """A parsed grammar and what llama.cpp will build of it."""

    rules: dict[str, Alts] = field(default_factory=dict)
    #: Rules llama.cpp creates: one a rule, one a group, one per optional repetition.
    rule_count: int = 0
    #: Grammar elements once repetitions are written out (llama.cpp's memory for it, 8 bytes each).
    elements: int = 0


def refuse(what: str, *, param: str, hint: str) -> UnsupportedFeature:
    return UnsupportedFeature(what, param=param, hint=hint)


_SPACE = re.compile(r"(?:[ \t]|#[^\r\n]*)*")
_SPACE_NL = re.compile(r"(?:[ \t\r\n]|#[^\r\n]*)*")
_NAME = re.compile(r"[A-Za-z0-9-]+")
_INT = re.compile(r"[0-9]+")
_ESC = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX = {"x": 2, "u": 4, "U": 8}


class Parser:
    def __init__(self, text: str, limits: GbnfLimits, param: str) -> None:
        self.text, self.limits, self.param, self.pos = text, limits, param, 0
        self.grammar = Grammar()

    def fail(self, what: str) -> UnsupportedFeature:
        line = self.text.count("\n", 0, self.pos) + 1
        near = self.text[self.pos : self.pos + 30]
        return refuse(
            f"the grammar in {self.param!r} does not parse: {what} (line {line}, near {near!r})",
            param=self.param,
            hint="write it in llama.cpp's GBNF syntax (name ::= alternates, one rule a line)",
        )

    def space(self, newline_ok: bool) -> None:
        pattern = _SPACE_NL if newline_ok else _SPACE
        m = pattern.match(self.text, self.pos)
        self.pos = m.end() if m else self.pos

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def char(self) -> int:
        """One character of a literal or class, as llama.cpp's ``parse_char`` reads it."""
        text, pos = self.text, self.pos
        if pos >= len(text):
            raise self.fail("unexpected end of input")
        if text[pos] != "\\":
            self.pos = pos + 1
            return ord(text[pos])
        esc = text[pos + 1 : pos + 2]
        if esc in _HEX:
            digits = text[pos + 2 : pos + 2 + _HEX[esc]]
            if len(digits) != _HEX[esc] or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise self.fail(f"expecting {_HEX[esc]} hex digits after \\{esc}")
            self.pos = pos + 2 + _HEX[esc]
            return int(digits, 16)
        if esc in _ESC:
            self.pos = pos + 2
            return ord(_ESC[esc])
        raise self.fail(f"unknown escape \\{esc}")

    def parse(self) -> Grammar:
        self.space(True)
        while self.pos < len(self.text):
            self.rule()
        return self.grammar

    def rule(self) -> None:
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.fail("expecting a rule name")
        name = m.group()
        self.pos = m.end()
        self.space(False)
        if not self.text.startswith("::=", self.pos):
            raise self.fail("expecting ::=")
        self.pos += 3
        self.space(True)
        alts = self.alternates(nested=False, depth=0)
        if name in self.grammar.rules:
            raise self.fail(f"rule {name!r} is defined twice")
        self.grammar.rules[name] = alts
        self.grammar.rule_count += 1
        if self.peek() not in ("\r", "\n", ""):
            raise self.fail("expecting a newline or the end")
        self.space(True)

    def alternates(self, *, nested: bool, depth: int) -> Alts:
        alts = [self.sequence(nested, depth)]
        while self.peek() == "|":
            self.pos += 1
            self.space(True)
            alts.append(self.sequence(nested, depth))
        return alts

    def sequence(self, nested: bool, depth: int) -> Seq:
        seq: Seq = []
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c in "*+?{":
                self.repeat(seq, c)
            else:
                item = self.item(c, depth)
                if item is None:
                    break
                seq.append(item)
            self.space(nested)
        return seq

    def item(self, c: str, depth: int) -> Item | None:
        """The symbol starting with ``c``, or None where the sequence ends."""
        if c == '"':
            self.pos += 1
            chars = []
            while self.peek() != '"':
                chars.append(chr(self.char()))
            self.pos += 1
            return Item("lit", "".join(chars))
        if c == "[":
            return self.char_class()
        if c in "<!":
            return self.token()
        m = _NAME.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return Item("ref", m.group())
        if c == "(":
            return self.group(depth)
        if c == ".":
            self.pos += 1
            return Item("any", None)
        return None

    def token(self) -> Item:
        text = self.text
        end = text.find(">", self.pos)
        if end < 0 or not (text.startswith("<", self.pos) or text.startswith("!<", self.pos)):
            raise self.fail("expecting a token reference <...>")
        item = Item("tok", text[self.pos : end + 1])
        self.pos = end + 1
        return item

    def group(self, depth: int) -> Item:
        if depth + 1 > self.limits.max_depth:
            raise refuse(
                f"the grammar in {self.param!r} nests groups deeper than {self.limits.max_depth} levels",
                param=self.param,
                hint=f"flatten it into named rules (at most {self.limits.max_depth} nested parentheses)",
            )
        self.pos += 1
        self.space(True)
        inner = self.alternates(nested=True, depth=depth + 1)
        if self.peek() != ")":
            raise self.fail("expecting ')'")
        self.pos += 1
        self.grammar.rule_count += 1
        return Item("group", inner)

    def repeat(self, seq: Seq, c: str) -> None:
        if not seq or (seq[-1].kind == "lit" and seq[-1].value == ""):
            raise self.fail(f"{c!r} with nothing before it to repeat")
        self.pos += 1
        lo, hi = {"*": (0, UNBOUNDED), "+": (1, UNBOUNDED), "?": (0, 1)}.get(c) or self.counts()
        stacked, inner = 1, seq[-1]
        while inner.kind == "rep":
            stacked, inner = stacked + 1, inner.value  # type: ignore[assignment]
        if stacked > MAX_STACKED:
            raise self.fail(f"more than {MAX_STACKED} repetition operators in a row")
        seq[-1] = Item("rep", seq[-1], lo, hi)

    def counts(self) -> tuple[int, int]:
        self.space(False)
        m = _INT.match(self.text, self.pos)
        if not m:
            raise self.fail("expecting a count after '{'")
        lo, hi = int(m.group()), UNBOUNDED
        self.pos = m.end()
        self.space(False)
        if self.peek() == "}":
            hi = lo
        elif self.peek() == ",":
            self.pos += 1
            self.space(False)
            m = _INT.match(self.text, self.pos)
            if m:
                hi = int(m.group())
                self.pos = m.end()
                self.space(False)
            if self.peek() != "}":
                raise self.fail("expecting '}'")
        else:
            raise self.fail("expecting ',' or '}'")
        self.pos += 1
        limit = self.limits.max_repeat
        if lo > limit or hi > limit:
            raise refuse(
                f"the grammar in {self.param!r} repeats something {max(lo, hi)} times; the limit is {limit}",
                param=self.param,
                hint=f"keep repetition counts at or under {limit}",
            )
        if hi != UNBOUNDED and hi < lo:
            raise self.fail(f"repetition {{{lo},{hi}}} has its maximum below its minimum")
        return lo, hi

    def char_class(self) -> Item:
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            lo = self.char()
            hi = lo
            if self.peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                hi = self.char()
            ranges.append((lo, hi))
        self.pos += 1
        return Item("cls", (negated, tuple(ranges)))
