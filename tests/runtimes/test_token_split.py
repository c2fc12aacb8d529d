"""A long text tokenized in pieces gives exactly the tokens of one call (token_split.py): the
cut rules on synthetic special tokens, then real llama.cpp vocabularies (Gemma 3's SPM, SmolLM2's
BPE, and the vocabulary-only GGUFs the llama-cpp-python sdist ships, where the test cache has
them) against random texts full of turn markers, whitespace beside them and broken markers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from localrun.runtimes.llamacpp import token_split
from localrun.runtimes.llamacpp.token_split import Specials, cut_points, pieces_of, specials_from
from localrun.runtimes.llamacpp.tokens import VocabScan, split_rules, tokenize_bytes
from tests.conftest import GEMMA_CACHE, needs_llama

# --- the cut rules ------------------------------------------------------------------------------


def _specials(*texts: bytes, lstrip: tuple[bytes, ...] = ()) -> Specials:
    found = specials_from([(t, t in lstrip) for t in texts], template="".join(t.decode() for t in texts))
    assert found is not None
    return found


def test_markers_are_the_templates_special_texts_that_strip_nothing():
    s = specials_from([(b"<turn>", False), (b"<eot>", True), (b"<unused9>", False), (b"\n", False)], "<turn>x<eot>")
    assert s is not None and s.markers == (b"<turn>",)  # <eot> strips; <unused9> is not in it; \n too short
    assert s.by_length[1] == {b"\n"} and s.by_length[5] == {b"<eot>"}
    assert specials_from([(b"<turn>", False)], "no markers here") is None


def test_cuts_land_before_a_marker_near_each_share(monkeypatch):
    monkeypatch.setattr(token_split, "MIN_PIECE_BYTES", 16)
    s = _specials(b"<T>")
    data = b"".join(b"<T>" + bytes([97 + i % 26]) * 37 for i in range(12))  # 480 bytes, a marker every 40
    cuts = cut_points(data, s, 4)
    assert len(cuts) == 3 and all(data.startswith(b"<T>", c) for c in cuts)
    assert [abs(c - len(data) * i // 4) < 40 for i, c in enumerate(cuts, 1)] == [True] * 3
    assert b"".join(pieces_of(data, cuts)) == data
    assert cut_points(data, s, 1) == [] and cut_points(data, None, 4) == []
    monkeypatch.setattr(token_split, "MIN_PIECE_BYTES", 400)
    assert cut_points(data, s, 4) == []  # too short for two pieces of 400


def test_no_cut_where_another_special_text_overlaps_the_marker(monkeypatch):
    monkeypatch.setattr(token_split, "MIN_PIECE_BYTES", 8)
    s = _specials(b"<T>", b"x<T", b"T>y")
    for data in (b"a" * 40 + b"x<T>" + b"b" * 40, b"a" * 40 + b"<T>y" + b"b" * 40):
        assert cut_points(data, s, 2) == []  # llama.cpp would match the longer text there
    ok = b"a" * 40 + b"<T>" + b"b" * 40
    assert cut_points(ok, s, 2) == [40]
    inside = _specials(b"<T>", b"T")  # a shorter text inside the marker is matched after it: harmless
    assert cut_points(ok, inside, 2) == [40]


def test_raw_text_is_cut_after_a_newline_no_token_merges_across(monkeypatch):
    monkeypatch.setattr(token_split, "MIN_PIECE_BYTES", 8)
    s = specials_from([(b"\n\n", False), (b"<T>", False)], "", need_markers=False)
    assert s is not None and s.markers == ()
    data = b"a" * 30 + b"\nb" + b"c" * 30
    assert cut_points(data, s, 2, frozenset()) == [31]  # right after the newline
    assert cut_points(data, s, 2, frozenset(b"b")) == []  # a token holds "\nb": it could merge across
    assert cut_points(data, s, 2) == []  # no newline cuts (not SPM, or a space prefix): no marker either
    spans = b"a" * 30 + b"\n\nc" + b"c" * 30  # cutting between the two newlines splits a special text
    assert cut_points(spans, s, 2, frozenset()) == [32]


# --- real vocabularies --------------------------------------------------------------------------


class Vocab:
    """A vocabulary-only llama.cpp model, read by the session's own pass and rules: its special
    tokens, where it may be cut, and one-call tokenize."""

    def __init__(self, path: Path) -> None:
        import llama_cpp as L

        self.L = L
        params = L.llama_model_default_params()
        params.vocab_only = True
        self.model = L.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, path
        self.vocab = L.llama_model_get_vocab(self.model)
        scan = VocabScan(L, self.model, path.name)
        scan.result()
        self.specials = scan.specials()
        self.splits, raw = split_rules(L, self.vocab)
        self.followers = scan.newline_followers() if raw else None  # newline cuts, as the session allows

    def tokenize(self, data: bytes, add_special: bool) -> list[int]:
        return tokenize_bytes(self.L, self.vocab, data, add_special)

    def close(self) -> None:
        self.L.llama_model_free(self.model)


WORDS = ["the", "cat", "  ", "\n", "\n\n", "\t", "def f(x):", '{"a": 1}', "12345", "naïve", "日本語", "🙂", " "]
WORDS += ["x" * 30, "\n ", "\n\t", ".\n", "\n-"]


def _texts(markers: list[bytes], rng: random.Random, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(40, 300)):
            r = rng.random()
            if r < 0.15:
                m = rng.choice(markers)
                parts.append(m[: rng.randint(1, len(m) - 1)] if rng.random() < 0.2 else m)  # now and then broken
            else:
                parts.append(rng.choice(WORDS).encode())
            if rng.random() < 0.3:
                parts.append(rng.choice([b" ", b"\n", b"  ", b""]))  # whitespace beside markers (strip rules)
        out.append(b"".join(parts))
    return out


def _vocab_files(gemma: Path, smol: Path) -> list[Path]:
    sdist = sorted(GEMMA_CACHE.glob("llama.cpp-*/src/vendor/llama.cpp/models/ggml-vocab-*.gguf"))
    return [gemma, smol, *sdist]


@needs_llama
@pytest.mark.llama
def test_pieces_tokenize_as_one_call_on_real_vocabularies(gemma_gguf, smollm2_path, monkeypatch):
    monkeypatch.setattr(token_split, "MIN_PIECE_BYTES", 64)  # many cuts in short texts
    rng = random.Random(7)
    checked, raw = 0, []
    for path in _vocab_files(gemma_gguf, smollm2_path):
        v = Vocab(path)
        try:
            markers = sorted({t for t, lstrip in v.specials if len(t) >= 3 and not lstrip})[:12]
            if not v.splits or not markers:
                continue
            s = specials_from(v.specials, "".join(m.decode(errors="replace") for m in markers))
            if s is None:
                continue
            raw += [path.name] if v.followers is not None else []
            for data in _texts(list(s.markers), rng, 12):
                for pieces in (2, 3, 8):
                    cuts = cut_points(data, s, pieces, v.followers)
                    for add_special in (True, False):
                        want = v.tokenize(data, add_special)
                        got = v.tokenize(pieces_of(data, cuts)[0], add_special)
                        for part in pieces_of(data, cuts)[1:]:
                            got += v.tokenize(part, False)
                        assert got == want, (path.name, cuts)
                    checked += bool(cuts)
        finally:
            v.close()
    assert checked >= 2 * 12 * 3  # Gemma and SmolLM2 at least, every text cut
    assert gemma_gguf.name in raw  # and Gemma's raw text after newlines too


@needs_llama
@pytest.mark.llama
def test_a_session_tokenizes_a_long_chat_prompt_in_pieces_to_the_same_tokens(gemma_gguf):
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime
    from localrun.types import FileEntry, Format, ModelRecord, Plan

    record = ModelRecord(name="gemma", format=Format.GGUF, path=str(gemma_gguf), files=(FileEntry(str(gemma_gguf), 1),))
    s = LlamaCppRuntime().load(record, Plan(runtime="llama.cpp", n_ctx=2048, n_threads=2, options={"n_slots": 1}))
    try:
        turn = "<start_of_turn>user\nquestion {i}: {words}<end_of_turn>\n<start_of_turn>model\nok {i}<end_of_turn>\n"
        turns = "".join(turn.format(i=i, words="lorem ipsum " * 90) for i in range(40))
        data = turns.encode()
        s._eog.result()  # the vocabulary pass is done: the split has its special tokens
        cuts = s.prompting.splitter.cuts(data)
        assert len(cuts) == 1 and data.startswith(b"<start_of_turn>", cuts[0])  # 2 threads, 2 pieces
        whole = s.prompting.tokenize_bytes(data, True)
        assert s.tokenize(turns, add_special=True) == whole and len(whole) > 7000
    finally:
        s.close()
