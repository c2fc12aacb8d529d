"""Where a prompt's last user message begins (runtimes/llamacpp/turns.py): the position a
sliding-window model's slot leaves a state at, so an agent's next session (the same system
prompt and tools, another question) restores everything before its question."""

from __future__ import annotations

from localrun.runtimes.llamacpp.turns import MARGIN, TurnPrompt, token_at, turn_bytes
from localrun.types import Message


def test_turn_bytes_finds_the_last_user_message_in_the_rendered_text():
    text = "<s>[SYS]be brief[/SYS][U]hi[/U][A]hello[/A][U]what is 2+2?[/U][A]"
    msgs = [
        Message("system", "be brief"),
        Message("user", "hi"),
        Message("assistant", "hello"),
        Message("user", "what is 2+2?"),
    ]
    assert turn_bytes(text, msgs) == text.index("what is")
    as_dicts = [{"role": m.role, "content": m.content} for m in msgs]
    assert turn_bytes(text, as_dicts) == text.index("what is")


def test_turn_bytes_counts_utf8_bytes_and_gives_up_when_the_template_changed_the_text():
    text = "système: « bref »\nuser: où est-ce ?\n"
    assert turn_bytes(text, [Message("user", "où est-ce ?")]) == len(text[: text.index("où")].encode())
    assert turn_bytes("USER: HI", [Message("user", "hi")]) is None  # not verbatim
    assert turn_bytes("a", [Message("assistant", "a")]) is None  # no user message
    assert turn_bytes("x", [Message("user", "  ")]) is None


def test_token_at_counts_tokens_that_end_before_the_offset_less_a_margin():
    pieces = {1: 3, 2: 5, 3: 5, 4: 2, 5: 7}  # token -> byte length
    tokens = [1, 2, 3, 2, 3, 2, 3, 4, 5, 5]  # ends at 3, 8, 13, 18, 23, 28, 33, 35, 42, 49
    assert token_at(tokens, 35, pieces.__getitem__, skip_first=False) == 8 - MARGIN
    assert token_at(tokens, 36, pieces.__getitem__, skip_first=False) == 8 - MARGIN  # mid-token: before it
    # A BOS the tokenizer added is not in the text: its bytes are not counted, the token is.
    assert token_at(tokens, 32, pieces.__getitem__, skip_first=True) == 8 - MARGIN  # 5, 10, ..., 30, 32
    assert token_at(tokens, 4, pieces.__getitem__, skip_first=False) is None


def test_turn_prompt_is_the_token_list_and_finds_its_turn_once():
    calls = []

    def find(tokens):
        calls.append(len(tokens))
        return 2

    p = TurnPrompt([5, 6, 7], find)
    assert p == [5, 6, 7] and p[1:] == [6, 7] and len(p) == 3
    assert p.turn() == 2 and p.turn() == 2 and calls == [3]
