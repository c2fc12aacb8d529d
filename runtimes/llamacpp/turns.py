"""Where a prompt's last user message begins, as a token position a saved state is worth keeping at
(for a raw prompt, its last paragraph, line or sentence: :func:`last_part_bytes`).

A model whose saved state restores only whole (a sliding-window model; checkpoints.py) keeps a
few states when a slot leaves, at chosen positions. The one a *new* session of the same agent
needs is where its own text starts: a coding agent's system prompt, tools and preamble are the
same from one session to the next, and the first user message is where they part. Claude Code
2.1 is the measured case: its two sessions in one project share 92% of a 19k-token prompt and
part at the user's question, ~1.6k tokens before the end (the agent list and reminders follow
it), below the tail state and above no 2,048-token mark worth its prefill.

The chat template renders a message's content verbatim (the rule ``continue_final_message``
relies on too), so the content's first characters are found in the rendered text, and the
token there by summing token lengths. Pieces are read with special tokens as text, which is
how the template wrote them; the BOS the tokenizer adds is not in the text and is skipped. A
position that comes out a little early only costs a few more prefilled tokens; one past the
boundary would make the state useless, so :data:`MARGIN` tokens are taken off.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

#: Characters of the last user message searched for in the rendered text: enough to be unique.
NEEDLE = 200
#: Tokens taken off the computed position (a space prefix, a merge across the boundary).
MARGIN = 4


class TurnPrompt(list[int]):
    """Prompt tokens that know where their last user message begins (``turn()``, computed on
    first use: only a slot that leaves needs it)."""

    __slots__ = ("_find", "_at")
    _at: int | None  # -1: not computed yet

    def __init__(self, tokens: Sequence[int], find: Callable[[Sequence[int]], int | None]) -> None:
        super().__init__(tokens)
        self._find, self._at = find, -1

    def turn(self) -> int | None:
        if self._at == -1:
            self._at = self._find(self)
        return self._at


def turn_of(prompt: Sequence[int]) -> int | None:
    """Where ``prompt``'s last user message begins, if it is a :class:`TurnPrompt` that says."""
    return prompt.turn() if isinstance(prompt, TurnPrompt) else None


def turn_bytes(text: str, messages: Sequence[Any]) -> int | None:
    """The UTF-8 offset in ``text`` where the last user message's content begins, or None (no
    user message, no text, or the template changed the text)."""
    for m in reversed(messages):
        role = m.get("role") if isinstance(m, dict) else getattr(m, "role", None)
        if role != "user":
            continue
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", "")
        if not isinstance(content, str) or not content.strip():
            return None
        at = text.rfind(content[:NEEDLE])
        return len(text[:at].encode("utf-8")) if at > 0 else None
    return None


#: Where a raw prompt's last part begins, tried in order: a paragraph, a line, a sentence.
_PART_BREAKS = ("\n\n", "\n", ". ", "? ", "! ")


def last_part_bytes(text: str) -> int | None:
    """The UTF-8 offset in a raw prompt (no messages) where its last part begins: its last
    paragraph, else line, else sentence — where a question put after a shared document starts.
    None when the text has no such break."""
    body = text.rstrip()
    for sep in _PART_BREAKS:
        at = body.rfind(sep)
        if at > 0:
            return len(body[: at + len(sep)].encode("utf-8"))
    return None


def special_piece_reader(llama: Any, vocab: Any) -> Callable[[int], int]:
    """``token -> byte length`` of its piece as a template writes it (special tokens as text)."""
    buf = ctypes.create_string_buffer(256)
    cache: dict[int, int] = {}

    def length(token: int) -> int:
        nonlocal buf
        hit = cache.get(token)
        if hit is None:
            n = llama.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
            hit = cache[token] = max(0, n)
        return hit

    return length


def token_at(tokens: Sequence[int], offset: int, length: Callable[[int], int], *, skip_first: bool) -> int | None:
    """How many of ``tokens`` end at or before byte ``offset`` of the text they came from, less
    :data:`MARGIN`; None when that leaves nothing."""
    pos, n = 0, 0
    for i, token in enumerate(tokens):
        if i == 0 and skip_first:
            continue
        pos += length(token)
        if pos > offset:
            break
        n = i + 1
    n -= MARGIN
    return n if n > 0 else None
