"""Where a chat prompt's last user message begins, on real tokenizers and templates (turns.py):
the position a sliding-window model's slot leaves a state at must lie at or just below where two
sessions with the same system prompt and another question part, never past it."""

from __future__ import annotations

import pytest

from localrun.runtimes.llamacpp.turns import MARGIN, TurnPrompt
from localrun.types import Format, Message, ModelRecord, Plan
from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

SYSTEM = "You are a coding agent. " + " ".join(f"Rule {i}: keep the tests green and say why." for i in range(60))


def _load(path):
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime

    record = ModelRecord(name="m", format=Format.GGUF, path=str(path))
    return LlamaCppRuntime().load(record, Plan(runtime="llama.cpp", n_ctx=4096, n_threads=2))


def _parting(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("which", ["smollm2_path", "gemma_gguf"])
def test_the_turn_lies_just_below_where_two_sessions_part(which, request):
    s = _load(request.getfixturevalue(which))
    try:
        first, _ = s.chat_prompt([Message("system", SYSTEM), Message("user", "Read README.md and say what it does.")])
        other, _ = s.chat_prompt([Message("system", SYSTEM), Message("user", "List the files here.")])
        turn_one = s.chat_prompt([Message("user", "hi"), Message("assistant", "hello"), Message("user", "bye")])[0]
        turn, short = first.turn(), turn_one.turn()
        late = s.chat_prompt([Message("system", SYSTEM), Message("user", "Late.")])[0]
    finally:
        s.close()
    assert isinstance(first, TurnPrompt)
    parted = _parting(first, other)
    assert parted > 400  # the system prompt's tokens
    assert turn is not None and parted - MARGIN - 3 <= turn <= parted, (turn, parted)
    assert short is None or short < len(turn_one)
    assert late.turn() is None  # asked after close: the vocabulary is gone, and nothing reads it
