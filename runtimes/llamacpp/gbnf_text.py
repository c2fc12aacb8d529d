"""Text-level pieces for composing GBNF grammars: renaming a grammar's rules so two grammars
can live in one, and the rules of "free text that never contains these strings".

Pure Python (no llama.cpp): the lazy tool grammar and the reasoning prefix are built from them
(:mod:`.lazy_grammar`).

**Free text without a string.** llama.cpp's server waits for a trigger before it switches its
grammar on; the same effect inside one grammar is "any text that does not contain the
trigger, then (optionally) the constrained part". The text side is the automaton of
Aho–Corasick over the forbidden strings written out as rules, one per state: a character that
completes a forbidden string has no way forward, so once a trigger is written only the
constrained part can go on — tokens written before the trigger was complete are checked
against it like any other. The rules are right-recursive, which llama.cpp's grammar stack
runs in constant space however long the text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["char_class", "free_text_rules", "prefix_rules"]

# Skipped when renaming: string literals, character classes, {m,n} repetitions, <token> references, comments.
_OPAQUE = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\{[^}]*\}|<[^>\s]*>|#[^\n]*')
_WORD = re.compile(r"[A-Za-z0-9_-]+")


def prefix_rules(gbnf: str, prefix: str) -> str:
    """``gbnf`` with every rule name (definitions and references) prefixed by ``prefix``."""
    out: list[str] = []
    pos = 0
    for m in _OPAQUE.finditer(gbnf):
        out.append(_WORD.sub(lambda w: prefix + w.group(0), gbnf[pos : m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_WORD.sub(lambda w: prefix + w.group(0), gbnf[pos:]))
    return "".join(out)


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"


def char_class(chars: Iterable[str], *, negated: bool = False) -> str:
    """A GBNF character class of ``chars`` (every one escaped, so none is special)."""
    body = "".join(_escape(c) for c in sorted(set(chars)))
    return f"[{'^' if negated else ''}{body}]"


def _literal(ch: str) -> str:
    return f'"{_escape(ch)}"'


class _Automaton:
    """Aho–Corasick over ``words``: states are the words' proper prefixes ('' first)."""

    def __init__(self, words: Sequence[str]) -> None:
        self.words = tuple(w for w in words if w)
        prefixes = {""} | {w[:i] for w in self.words for i in range(len(w))}
        self.states = sorted(prefixes, key=lambda p: (len(p), p))
        self.index = {p: i for i, p in enumerate(self.states)}
        self.alphabet = sorted({c for w in self.words for c in w})

    def step(self, state: str, ch: str) -> str | None:
        """The state after ``ch``, or None when ``state + ch`` ends with a forbidden word."""
        text = state + ch
        if any(text.endswith(w) for w in self.words):
            return None
        for start in range(len(text) + 1):  # the longest suffix that is a state
            if text[start:] in self.index:
                return text[start:]
        return ""  # pragma: no cover - '' is always a state


def free_text_rules(
    name: str,
    forbidden: Sequence[str],
    *,
    exit_rule: str | None = None,
    may_end: bool = True,
    not_first: str = "",
) -> str:
    """Rules for text that never contains any of ``forbidden``; the start rule is ``name``.

    At every point the text may stop and go on with ``exit_rule`` (the constrained part, which
    begins with a trigger, so a trigger's characters already written as text are also the
    start of that part) and, when ``may_end``, end there. ``not_first``: characters the text
    may not begin with (the first character of bare-JSON calls, say).
    """
    auto = _Automaton(forbidden)
    rules: list[str] = []
    # An empty alternative must come first: llama.cpp reads on across the line after a trailing '|'.
    head = [""] if may_end else []
    tail = [exit_rule] if exit_rule else []

    def body(state: str, exclude: str) -> list[str]:
        moves = {ch: auto.step(state, ch) for ch in auto.alphabet if ch not in exclude}
        listed = {ch: nxt for ch, nxt in moves.items() if nxt != ""}  # the rest go back to the start
        special = set(listed) | set(exclude)
        alts = [f"{char_class(special, negated=True) if special else '.'} {name}-0"]
        alts += [f"{_literal(ch)} {name}-{auto.index[nxt]}" for ch, nxt in listed.items() if nxt is not None]
        return head + alts + tail

    for state in auto.states:
        rules.append(f"{name}-{auto.index[state]} ::= " + " | ".join(body(state, "")))
    rules.append(f"{name} ::= " + " | ".join(body("", not_first)))
    return "\n".join(rules) + "\n"
