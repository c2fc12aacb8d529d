"""A GBNF grammar read and checked in Python before llama.cpp ever sees it.

llama.cpp's grammar parser and sampler trust their input: 20,000 nested ``(`` overflow its
recursive parser's stack (SIGSEGV), a range that matches nothing (``[z-a]``) leaves the
sampler with no token to pick (SIGABRT), and a left-recursive rule recurses for ever. Each of
those kills the worker and everything in flight on it. So every grammar — one a client sends
and one :mod:`localrun.chat.schema_grammar` writes — is read here first, by a parser that
follows llama.cpp's syntax (``llama-grammar.cpp``: rules ``name ::= alternates``, literals,
character classes, ``.``, groups, ``* + ? {m} {m,} {m,n}``, ``#`` comments, ``<token>``
references) and refuses, with a 400 that names the part and the limit:

* a grammar over :attr:`GbnfLimits.max_bytes`, over ``max_rules`` rules, groups nested deeper
  than ``max_depth``, a repetition count over ``max_repeat`` (llama.cpp's own cap is 2,000; above
  it llama.cpp silently drops the upper bound), or more than ``max_elements`` grammar elements
  once repetitions are written out as llama.cpp writes them;
* a syntax error, a reference to an undefined rule, no ``root`` rule;
* an empty or inverted character range, a negated class that excludes every character;
* a part that can never complete (a rule or alternative that matches no string): once the model
  entered it, no token would be allowed, and the sampler aborts;
* a left-recursive rule, and a repetition of something that can match the empty string (both
  loop for ever in llama.cpp).

What is accepted is therefore a grammar in which every started parse can still be completed.
"""

from __future__ import annotations

import functools
import logging
from typing import cast

from localrun.chat.gbnf_parse import (
    DEFAULT_LIMITS,
    MAX_CODEPOINT,
    UNBOUNDED,
    Alts,
    GbnfLimits,
    Grammar,
    Item,
    Parser,
    Seq,
    refuse,
)
from localrun.errors import UnsupportedFeature

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_LIMITS", "GbnfLimits", "Grammar", "check_gbnf"]


def _shown(cp: int) -> str:
    return chr(cp) if 0x20 < cp < 0x7F else f"\\x{cp:02X}" if cp < 0x100 else f"\\U{cp:08X}"


def _class_text(negated: bool, ranges: tuple[tuple[int, int], ...]) -> str:
    body = "".join(_shown(a) if a == b else f"{_shown(a)}-{_shown(b)}" for a, b in ranges)
    return f"[{'^' if negated else ''}{body}]"


def _class_empty(negated: bool, ranges: tuple[tuple[int, int], ...]) -> bool:
    if not negated:
        return not ranges
    covered = 0  # does the union of ranges cover every code point?
    for lo, hi in sorted(ranges):
        if lo > covered:
            return False
        covered = max(covered, hi + 1)
    return covered > MAX_CODEPOINT


class _Checker:
    """The checks that need the whole grammar: references, ranges, cost, completion, recursion."""

    def __init__(self, grammar: Grammar, limits: GbnfLimits, param: str) -> None:
        self.g, self.limits, self.param = grammar, limits, param
        self._items: dict[int, list[Item]] = {}

    def refuse(self, what: str, hint: str) -> UnsupportedFeature:
        return refuse(f"the grammar in {self.param!r} {what}", param=self.param, hint=hint)

    def items(self, alts: Alts) -> list[Item]:
        """Every item of ``alts``, groups and repetitions opened (iteratively); once per rule."""
        found = self._items.get(id(alts))
        if found is not None:
            return found
        out: list[Item] = []
        self._items[id(alts)] = out
        todo = [item for seq in alts for item in seq]
        while todo:
            item = todo.pop()
            out.append(item)
            if item.kind == "group":
                todo.extend(i for seq in item.value for i in seq)  # type: ignore[attr-defined]
            elif item.kind == "rep":
                todo.append(item.value)  # type: ignore[arg-type]
        return out

    def check_symbols(self) -> None:
        if "root" not in self.g.rules:
            raise self.refuse("has no 'root' rule", "name the start rule root")
        for name, alts in self.g.rules.items():
            for item in self.items(alts):
                if item.kind == "ref" and item.value not in self.g.rules:
                    raise self.refuse(
                        f"uses rule {item.value!r} (in {name!r}) without defining it", "define every rule"
                    )
                if item.kind == "cls":
                    negated, ranges = cast("tuple[bool, tuple[tuple[int, int], ...]]", item.value)
                    for lo, hi in ranges:
                        if hi < lo:
                            raise self.refuse(
                                f"has an inverted character range {_shown(lo)}-{_shown(hi)} in rule {name!r}",
                                "write ranges low to high",
                            )
                    if _class_empty(negated, ranges):
                        raise self.refuse(
                            f"has a character class that matches no character ({_class_text(negated, ranges)}) "
                            f"in rule {name!r}",
                            "remove it or let it match something",
                        )

    def cost(self) -> None:
        """Elements and rules as llama.cpp writes repetitions out (``S{m,n}``: m copies, n-m rules)."""
        elements, rules = 0, self.g.rule_count

        def size(item: Item) -> int:
            if item.kind == "lit":
                return max(1, len(item.value))  # type: ignore[arg-type]
            if item.kind == "cls":
                return 2 * len(item.value[1]) + 1  # type: ignore[index]
            if item.kind == "rep":
                return size(item.value)  # type: ignore[arg-type]
            return 1

        for item in (i for alts in self.g.rules.values() for i in self.items(alts)):
            if item.kind == "rep":
                inner = size(item.value)  # type: ignore[arg-type]
                optional = 1 if item.hi == UNBOUNDED else item.hi - item.lo
                elements += max(item.lo - 1, 0) * inner + optional * (inner + 3)
                rules += optional
            else:
                elements += size(item)
            elements += 1
        self.g.elements = elements
        if rules > self.limits.max_rules:
            raise self.refuse(
                f"makes {rules} rules once repetitions are written out; the limit is {self.limits.max_rules}",
                "use fewer rules or smaller repetition counts",
            )
        if elements > self.limits.max_elements:
            raise self.refuse(
                f"makes {elements} grammar elements once repetitions are written out; the limit is "
                f"{self.limits.max_elements}",
                "use smaller repetition counts",
            )

    def fixpoint(self, base: dict[str, bool], item_ok: object) -> dict[str, bool]:
        """Least fixpoint of a per-rule property: ``all`` of a sequence's items, ``any`` alternative."""
        state = dict(base)
        changed = True
        while changed:
            changed = False
            for name, alts in self.g.rules.items():
                if not state[name] and any(all(item_ok(i, state) for i in seq) for seq in alts):  # type: ignore[operator]
                    state[name] = changed = True
        return state

    def completes(self, item: Item, done: dict[str, bool]) -> bool:
        kind = item.kind
        if kind == "ref":
            return done[item.value]  # type: ignore[index]
        if kind == "group":
            return any(all(self.completes(i, done) for i in seq) for seq in item.value)  # type: ignore[attr-defined]
        if kind == "rep":
            return item.lo == 0 or self.completes(item.value, done)  # type: ignore[arg-type]
        return True

    def empty(self, item: Item, nullable: dict[str, bool]) -> bool:
        kind = item.kind
        if kind == "lit":
            return item.value == ""
        if kind == "ref":
            return nullable[item.value]  # type: ignore[index]
        if kind == "group":
            return any(all(self.empty(i, nullable) for i in seq) for seq in item.value)  # type: ignore[attr-defined]
        if kind == "rep":
            return item.lo == 0 or self.empty(item.value, nullable)  # type: ignore[arg-type]
        return False

    def check_completion(self) -> None:
        done = self.fixpoint(dict.fromkeys(self.g.rules, False), self.completes)
        if not done["root"]:
            raise self.refuse("matches nothing: rule 'root' can never complete", "give every rule a way to finish")
        for name, alts in self.g.rules.items():
            for item in [Item("group", alts), *self.items(alts)]:
                if item.kind != "group":
                    continue
                for n, seq in enumerate(cast(Alts, item.value)):
                    if not all(self.completes(i, done) for i in seq):
                        raise self.refuse(
                            f"has an alternative that can never complete (rule {name!r}, alternative {n + 1}): "
                            "a model that entered it could not go on",
                            "remove the alternative or give its rules a way to finish",
                        )

    def left_refs(self, seq: Seq, nullable: dict[str, bool]) -> set[str]:
        out: set[str] = set()
        for item in seq:
            inner = item
            while inner.kind == "rep":
                inner = inner.value  # type: ignore[assignment]
            if inner.kind == "ref":
                out.add(inner.value)  # type: ignore[arg-type]
            elif inner.kind == "group":
                for sub in inner.value:  # type: ignore[attr-defined]
                    out |= self.left_refs(sub, nullable)
            if not self.empty(item, nullable):
                break
        return out

    def check_recursion(self) -> None:
        nullable = self.fixpoint(dict.fromkeys(self.g.rules, False), self.empty)
        for name, alts in self.g.rules.items():
            for item in self.items(alts):
                if item.kind == "rep" and item.hi != 1 and self.empty(item.value, nullable):  # type: ignore[arg-type]
                    raise self.refuse(
                        f"repeats something that can match the empty string (in rule {name!r})",
                        "make the repeated part match at least one character",
                    )
        edges = {
            name: set().union(*(self.left_refs(seq, nullable) for seq in alts)) for name, alts in self.g.rules.items()
        }
        # Iterative depth-first search for a cycle among leftmost references.
        colour: dict[str, int] = {}
        for start in edges:
            if colour.get(start):
                continue
            stack: list[tuple[str, list[str]]] = [(start, sorted(edges[start]))]
            colour[start] = 1
            while stack:
                node, rest = stack[-1]
                if not rest:
                    colour[node] = 2
                    stack.pop()
                    continue
                nxt = rest.pop()
                if colour.get(nxt) == 1:
                    path = [n for n, _ in stack]
                    cycle = " → ".join(path[path.index(nxt) :] + [nxt])
                    raise self.refuse(f"is left-recursive ({cycle})", "rewrite the rule so it consumes input first")
                if not colour.get(nxt):
                    colour[nxt] = 1
                    stack.append((nxt, sorted(edges[nxt])))


@functools.lru_cache(maxsize=4096)
def _parse_rule_line(line: str, limits: GbnfLimits) -> tuple[str, Alts, int]:
    parsed = Parser(line, limits, "grammar").parse()
    ((name, alts),) = parsed.rules.items()
    return name, alts, parsed.rule_count


def clear_parsed_lines() -> None:
    _parse_rule_line.cache_clear()


def _by_line(text: str, limits: GbnfLimits, param: str) -> Grammar:
    """A grammar written one whole rule a line (the converter's), each line parsed once per
    process: a tool list's grammars share most of their rules (JSON's primitives, formats)."""
    grammar = Grammar()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            name, alts, count = _parse_rule_line(line, limits)
        except UnsupportedFeature as exc:
            raise refuse(exc.message.replace("'grammar'", repr(param), 1), param=param, hint=exc.hint or "") from exc
        if name in grammar.rules:
            raise refuse(f"the grammar in {param!r} defines rule {name!r} twice", param=param, hint="define it once")
        grammar.rules[name] = alts
        grammar.rule_count += count
    return grammar


def check_gbnf(
    text: str, *, param: str = "grammar", limits: GbnfLimits = DEFAULT_LIMITS, one_rule_a_line: bool = False
) -> Grammar:
    """Parse and check ``text``; the parsed grammar, or an :class:`UnsupportedFeature` (a 400)
    naming what is wrong and the limit it broke. ``one_rule_a_line``: the text is known to hold
    one whole rule on each line (localrun's converter writes it so), which lets lines be cached."""
    if not isinstance(text, str):
        raise refuse(f"the grammar in {param!r} must be a string", param=param, hint="send GBNF text")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise refuse(
            f"the grammar in {param!r} is {size} bytes; the limit is {limits.max_bytes}",
            param=param,
            hint="send a smaller grammar",
        )
    if "\x00" in text:
        raise refuse(f"the grammar in {param!r} contains a NUL character", param=param, hint="remove it")
    grammar = _by_line(text, limits, param) if one_rule_a_line else Parser(text, limits, param).parse()
    checker = _Checker(grammar, limits, param)
    checker.check_symbols()
    checker.cost()
    checker.check_completion()
    checker.check_recursion()
    return grammar
