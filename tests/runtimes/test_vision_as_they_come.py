"""A request's media are tokenized as they come: each item is decoded, made a bitmap, tokenized
and its bitmap freed before the next one is decoded, so the worker holds one item's pixels at a
time, not the whole request's (real llama.cpp: Gemma 3 270M with the tiny fixture projector).

Before, every bitmap of a request was built first and all were tokenized in one
``mtmd_tokenize`` call: 8 pictures held 8 pictures' pixels at once (32 of the largest allowed:
32 × 4.8 MB at Gemma 3's fit). mtmd's C API takes every bitmap of a text in one call, so the
prompt is tokenized in pieces (the text before each marker, the marker, its bitmap) and the
chunk lists joined; mtmd splits the text at the markers and tokenizes each part on its own
anyway, so the pieces give the same positions, chunks and embeddings as the one call.
"""

from __future__ import annotations

import pytest

from localrun.errors import InvalidMedia
from localrun.types import MEDIA_MARKER, Cancel, ChatRequest, Media, Message, Plan, Sampling
from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

FIT = 2 * 64 * 64  # the tiny projector's 64-px encoder


def _image(seed: int, size: tuple[int, int] = (1000, 800)) -> Media:
    from tests.support.vision import image_bytes

    return Media("image", image_bytes("PNG", size, seed=seed), "image/png")


def _req(media: tuple[Media, ...]) -> ChatRequest:
    msg = Message("user", MEDIA_MARKER * len(media) + " What is in them?", media=media)
    return ChatRequest(messages=(msg,), sampling=Sampling(temperature=0.0, max_tokens=1))


@pytest.fixture(scope="module")
def session(gemma_vision):
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime

    options = {"n_slots": 1, "media": {"decode_pixels": FIT}}
    s = LlamaCppRuntime().load(
        gemma_vision.record(), Plan(runtime="llama.cpp", n_ctx=2048, n_threads=2, options=options)
    )
    yield s
    s.close()


def test_the_worker_holds_one_items_pixels_at_a_time(session):
    bitmaps = session._media.projector.bitmaps
    bitmaps.reset_peak()
    list(session.chat(_req(tuple(_image(k) for k in range(8))), Cancel()))
    assert bitmaps.live == 0
    peak = bitmaps.reset_peak()
    # One 1000×800 picture scaled to the fit is ~24 KB of RGB; all eight at once were ~8 times that.
    assert 0.9 * FIT * 3 < peak <= FIT * 3, peak

    # A bad item after good ones: a 400 naming it, every bitmap and chunk list freed, the session well.
    bad = Media("image", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "image/png")
    with pytest.raises(InvalidMedia):
        list(session.chat(_req((_image(1), _image(2), bad)), Cancel()))
    assert bitmaps.live == 0
    list(session.chat(_req((_image(3),)), Cancel()))


@pytest.mark.parametrize("add_special", [True, False])
def test_tokenized_in_pieces_is_what_one_call_makes(session, add_special):
    projector, decoder = session._media.projector, session._media._decoder_now()
    m = MEDIA_MARKER
    for text, media in (
        (f"Look: {m} and {m}{m} then tell me.", (_image(10), _image(11), _image(10))),  # one picture twice
        (f"{m} first, then words", (_image(12, (300, 200)),)),  # a prompt that starts with a picture
        ("no picture at all", ()),
    ):
        got = session.prompting.media_prompt(text, media, add_special=add_special)
        images = [decoder.image(item.data, FIT) for item in media]
        want = projector.tokenize(
            text, [projector.image_bitmap(i.nx, i.ny, i.rgb, i.digest) for i in images], add_special=add_special
        )
        try:
            assert got.tokens == want.tokens
            shape = [(s.start, s.n_tokens, s.kind, s.digest, s.non_causal) for s in got.spans]
            assert shape == [(s.start, s.n_tokens, s.kind, s.digest, s.non_causal) for s in want.spans]
            assert len(shape) == len(media)
            for a, b in zip(got.spans, want.spans):  # the encoder thread is idle: no request is running
                assert list(projector.encode(got.native, a)) == list(projector.encode(want.native, b))
        finally:
            got.close()
            want.close()


@pytest.mark.slow  # Whisper pads every chunk to 30 s: two clips' mel twice, four encodes
def test_audio_in_pieces_is_what_one_call_makes(gemma_audio):
    """A clip past 30 s is several chunks with one id: their ``#n`` and chunk indices carry across pieces."""
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime
    from tests.support.vision import wav_bytes

    session = LlamaCppRuntime().load(
        gemma_audio.record("gemma-audio"), Plan(runtime="llama.cpp", n_ctx=4096, n_threads=2, options={"n_slots": 1})
    )
    try:
        projector, decoder = session._media.projector, session._media._decoder_now()
        short, long = (Media("audio", wav_bytes(s), "audio/wav") for s in (1.0, 35.0))
        media = (short, long, short)
        text = f"Hear {MEDIA_MARKER}, then {MEDIA_MARKER} and {MEDIA_MARKER} again."
        got = session.prompting.media_prompt(text, media, add_special=True)
        clips = [decoder.audio(item.data, projector.sample_rate) for item in media]
        want = projector.tokenize(text, [projector.audio_bitmap(c.samples, c.digest) for c in clips], add_special=True)
        try:
            assert got.tokens == want.tokens
            shape = [(s.start, s.n_tokens, s.kind, s.digest) for s in got.spans]
            assert shape == [(s.start, s.n_tokens, s.kind, s.digest) for s in want.spans]
            assert len(shape) == 4 and shape[1][3].endswith("#0") and shape[2][3].endswith("#1")  # the long clip: 2
            assert [s.index for s in got.spans] != [s.index for s in want.spans]  # 4 lists, not one: joined
            for k in (2, 3):  # the chunks past a piece's first list: the long clip's second, the short one again
                assert list(projector.encode(got.native, got.spans[k])) == list(
                    projector.encode(want.native, want.spans[k])
                )
        finally:
            got.close()
            want.close()
    finally:
        session.close()
