"""Token bytes to chunk text: split UTF-8 and stop strings that span tokens."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from localrun.runtimes.llamacpp.text import StopMatcher, TextAssembler


def test_multibyte_character_split_across_tokens_is_held_until_complete():
    t = TextAssembler()
    data = "é😀".encode()
    assert t.feed(data[:1]) == ("", False)
    assert t.feed(data[1:3]) == ("é", False)
    assert t.feed(data[3:5]) == ("", False)
    assert t.feed(data[5:]) == ("😀", False)
    assert t.finish() == ""


def test_invalid_bytes_become_replacement_characters_instead_of_stalling():
    t = TextAssembler()
    assert t.feed(b"\xff") == ("\ufffd", False)
    assert t.feed(b"a\xe2\x82") == ("a", False)
    assert t.finish() == "\ufffd"


def test_text_that_may_start_a_stop_is_held_back_then_released():
    m = StopMatcher(["</end>"])
    assert m.push("hello </") == ("hello ", False)
    assert m.push("e") == ("", False)
    assert m.push("x") == ("</ex", False)
    assert m.push(" bye </en") == (" bye ", False)
    assert m.flush() == "</en"


def test_stop_spanning_pieces_cuts_right_before_it():
    m = StopMatcher(["STOP"])
    assert m.push("abc ST") == ("abc ", False)
    assert m.push("OP and more") == ("", True)


def test_earliest_of_several_stops_wins():
    m = StopMatcher(["world", "lo"])
    assert m.push("hello world") == ("hel", True)


def test_no_stops_passes_text_straight_through():
    m = StopMatcher(["", ""])
    assert m.push("any text") == ("any text", False)


@given(
    st.text(max_size=40), st.lists(st.integers(min_value=1, max_value=7), max_size=20), st.text(min_size=1, max_size=4)
)
def test_any_split_of_the_bytes_gives_the_same_text_as_one_piece(text, cuts, stop):
    """However the bytes are cut into tokens, the emitted text is the input up to the
    first stop string (or all of it), never more, never less."""
    data = text.encode()
    pieces, i = [], 0
    for c in cuts:
        pieces.append(data[i : i + c])
        i += c
    pieces.append(data[i:])
    t = TextAssembler([stop])
    out, stopped = [], False
    for p in pieces:
        emitted, stopped = t.feed(p)
        out.append(emitted)
        if stopped:
            break
    if not stopped:
        out.append(t.finish())
    expected = text[: text.find(stop)] if stop in text else text
    assert "".join(out) == expected
    assert stopped == (stop in text)


def test_a_shorter_stop_inside_a_longer_one_that_began_earlier_cuts_at_the_longer():
    """Hypothesis found it: stops 'a' and 'baa' on 'ba'|'a' must cut before 'b', as on the whole text."""
    m = StopMatcher(["a", "baa"])
    assert m.push("ba") == ("", False)  # 'a' is complete, but 'baa' may still be starting at 0
    assert m.push("a") == ("", True)
    m = StopMatcher(["a", "baa"])
    assert m.push("ba") == ("", False)
    assert m.push("x") == ("b", True)  # 'baa' failed: the earliest hit is 'a' at 1
    m = StopMatcher(["a", "baa"])
    m.push("ba")
    assert m.flush() == "b"  # the stream ended holding a complete stop: cut before it
