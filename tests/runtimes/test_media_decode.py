"""The media decoder: real files in, mtmd-ready pixels and samples out, through the real child
process; every bad file a named InvalidMedia, and a crash or a hang in the child costs one request."""

from __future__ import annotations

import io
import os
import struct
import threading
import zlib

import numpy as np
import pytest

from localrun.errors import InvalidMedia
from localrun.runtimes.llamacpp.media import formats as F
from localrun.runtimes.llamacpp.media.decoder import TEST_ABORT, TEST_HANG, TEST_HOOKS_ENV, MediaDecoder
from tests.support import vision as V


@pytest.fixture(scope="module")
def decoder():
    with MediaDecoder(max_bytes=2_000_000, max_pixels=4_000_000, max_audio_s=5.0, timeout_s=20.0) as d:
        yield d


def _pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def _refused(decoder, data: bytes, *words: str, audio: bool = False) -> str:
    with pytest.raises(InvalidMedia) as info:
        decoder.audio(data, 16000) if audio else decoder.image(data)
    message = str(info.value)
    for word in words:
        assert word in message, message
    return message


# --- images ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "GIF", "WEBP", "JPEG"])
def test_each_taken_format_decodes_to_its_pixels(decoder, fmt):
    save = {"lossless": True} if fmt == "WEBP" else {}
    data = V.image_bytes(fmt, (40, 30), seed=3, **save)
    got = decoder.image(data)
    assert (got.nx, got.ny, len(got.rgb)) == (40, 30, 40 * 30 * 3)
    assert np.array_equal(np.frombuffer(got.rgb, np.uint8).reshape(30, 40, 3), _pixels(data))
    assert got.digest == F.image_digest(40, 30, got.rgb)


def test_the_digest_is_of_pixels_not_of_the_file(decoder):
    png = decoder.image(V.image_bytes("PNG", seed=5))
    webp = decoder.image(V.image_bytes("WEBP", seed=5, lossless=True))
    other = decoder.image(V.image_bytes("PNG", seed=6))
    assert png.digest == webp.digest != other.digest


def test_exif_orientation_is_applied(decoder):
    from PIL import Image

    img = Image.fromarray(np.zeros((20, 50, 3), np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° CW to view": a phone photo taken upright
    buf = io.BytesIO()
    img.save(buf, "JPEG", exif=exif)
    got = decoder.image(buf.getvalue())
    assert (got.nx, got.ny) == (20, 50)


def test_alpha_is_composited_on_white(decoder):
    from PIL import Image

    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[0, 0] = (255, 0, 0, 255)  # opaque red stays red; the transparent rest turns white
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, "PNG")
    px = np.frombuffer(decoder.image(buf.getvalue()).rgb, np.uint8).reshape(2, 2, 3)
    assert px[0, 0].tolist() == [255, 0, 0] and px[1, 1].tolist() == [255, 255, 255]


def test_a_gif_gives_its_first_frame(decoder):
    from PIL import Image

    frames = [Image.new("RGB", (8, 8), c) for c in ((0, 0, 255), (0, 255, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50)
    px = np.frombuffer(decoder.image(buf.getvalue()).rgb, np.uint8).reshape(8, 8, 3)
    assert px[4, 4].tolist() == [0, 0, 255]


def test_16_bit_greyscale_is_scaled_not_clipped(decoder):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((4, 4), 32768, np.uint16)).save(buf, "PNG")
    px = np.frombuffer(decoder.image(buf.getvalue()).rgb, np.uint8)
    assert set(px.tolist()) == {127}


def test_other_formats_are_refused_by_name(decoder):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "TIFF")
    _refused(decoder, buf.getvalue(), "TIFF", "PNG, JPEG, WebP, GIF or BMP")
    _refused(decoder, b"\x00\x00\x00\x18ftypheic" + b"\x00" * 40, "HEIC")
    _refused(decoder, b"<svg xmlns='http://www.w3.org/2000/svg'/>", "SVG")
    _refused(decoder, b"just some text, not a picture", "not an image", "PNG, JPEG, WebP, GIF or BMP")


def _png_claiming(width: int, height: int) -> bytes:
    """A valid PNG signature and IHDR (right CRC) with a few bytes of IDAT: a tiny file whose
    header claims a huge picture."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _jpeg_claiming(width: int, height: int) -> bytes:
    data = bytearray(V.image_bytes("JPEG", (16, 16)))
    sof = data.index(b"\xff\xc0")  # baseline SOF0: length(2) precision(1) height(2) width(2)
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.mark.parametrize("make", [_png_claiming, _jpeg_claiming])
def test_a_tiny_file_claiming_huge_dimensions_is_refused_from_its_header(decoder, make):
    data = make(60000, 60000)
    assert len(data) < 1024
    _refused(decoder, data, "3600000000 pixels", "over the 4000000-pixel cap")


def test_the_pixel_cap_counts_pixels_not_bytes(decoder):
    from PIL import Image

    def flat(size) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", size, (9, 9, 9)).save(buf, "PNG")
        return buf.getvalue()

    assert decoder.image(flat((2000, 2000))).nx == 2000  # exactly the cap passes
    _refused(decoder, flat((2001, 2000)), "4002000 pixels", "4000000-pixel cap")


def test_the_byte_cap_and_an_empty_file(decoder):
    _refused(decoder, b"\x89PNG" + b"\0" * 2_000_000, "2000004 bytes", "2000000-byte cap")
    _refused(decoder, b"", "empty")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_truncated_files_are_refused(decoder, fmt):
    data = V.image_bytes(fmt, (64, 64), seed=1)
    for cut in (len(data) // 2, 40, 12):
        _refused(decoder, data[:cut], fmt if fmt != "WEBP" else "")


def test_garbage_after_a_valid_signature_is_a_corrupt_header(decoder):
    _refused(decoder, b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "corrupt PNG")
    _refused(decoder, b"\xff\xd8\xff\xe0" + os.urandom(60), "JPEG")


def test_our_header_check_holds_where_pillows_guard_is_off(monkeypatch):
    """The size check on img.size does not rely on Pillow's guard (pure function, this process)."""
    from PIL import Image

    monkeypatch.setattr(Image, "_decompression_bomb_check", lambda size: None)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # decode_image sets it
    with pytest.raises(F.BadMedia, match="300×300 = 90000 pixels, over the 40000-pixel cap"):
        F.decode_image(V.image_bytes("PNG", (300, 300)), max_pixels=40_000)


# --- audio -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_pcm_wav_of_every_width_becomes_16khz_float(decoder, width):
    got = decoder.audio(V.wav_bytes(0.5, 16000, sampwidth=width), 16000)
    samples = np.frombuffer(got.samples, "<f4")
    assert got.n == samples.size == 8000
    assert 0.45 < np.abs(samples).max() <= 0.51  # the tone's 0.5 amplitude, whatever the width
    assert got.digest == F.audio_digest(16000, got.samples)


def test_float_wav_and_stereo_and_resampling(decoder):
    assert decoder.audio(V.float_wav_bytes(0.25), 16000).n == 4000
    got = decoder.audio(V.wav_bytes(1.0, 44100, channels=2, freq=1000.0), 16000)
    samples = np.frombuffer(got.samples, "<f4")
    assert got.n == 16000
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(int(np.argmax(spectrum)) - 1000) <= 1  # a 1 kHz tone stays at 1 kHz after 44.1→16 kHz
    assert 0.45 < np.abs(samples[100:-100]).max() < 0.55


def test_downsampling_removes_what_the_new_rate_cannot_hold():
    rate = 48000
    t = np.arange(rate) / rate
    tone = np.sin(2 * np.pi * 11000 * t).astype(np.float32)  # above 16 kHz's 8 kHz Nyquist
    out = F.resample(tone, rate, 16000)
    assert out.size == 16000 and np.abs(out).max() < 0.05  # filtered away, not folded back to 5 kHz


def test_mp3_is_decoded(decoder):
    pytest.importorskip("lameenc")
    got = decoder.audio(V.mp3_bytes(1.0, 22050, freq=500.0), 16000)
    assert abs(got.n - 16000) < 2000  # MP3 pads with encoder delay; the length is about right
    spectrum = np.abs(np.fft.rfft(np.frombuffer(got.samples, "<f4")))
    assert abs(np.argmax(spectrum) * 16000 / (2 * (spectrum.size - 1)) - 500) < 10


def test_audio_over_the_duration_cap_is_refused_before_decoding(decoder):
    _refused(decoder, V.wav_bytes(6.0, 8000), "6.0 s", "5-second cap", audio=True)
    pytest.importorskip("lameenc")
    _refused(decoder, V.mp3_bytes(6.0, 8000), "5-second cap", audio=True)


def test_bad_audio_is_refused_by_name(decoder):
    _refused(decoder, b"ID3\x04" + b"\x00" * 60, "MP3", audio=True)
    _refused(decoder, b"this is not audio", "WAV, MP3, FLAC or Ogg Vorbis", audio=True)
    wav = V.wav_bytes(0.1)
    _refused(decoder, wav[:30], "corrupt WAV", audio=True)
    alaw = bytearray(wav)
    alaw[20:22] = struct.pack("<H", 6)  # A-law: a real WAV encoding that is not taken
    _refused(decoder, bytes(alaw), "format 6", audio=True)
    _refused(decoder, V.wav_bytes(0.0), "no samples", audio=True)


def test_a_truncated_wav_keeps_its_whole_frames(decoder):
    wav = V.wav_bytes(0.5)
    assert decoder.audio(wav[: len(wav) - 1001], 16000).n == 8000 - 501


# --- the child process -------------------------------------------------------------------------


@pytest.fixture
def hooked(monkeypatch):
    monkeypatch.setenv(TEST_HOOKS_ENV, "1")
    made = []

    def make(**kw):
        made.append(MediaDecoder(**kw))
        return made[-1]

    yield make
    for d in made:
        d.close()


def test_it_decodes_in_another_process(decoder):
    children = list(decoder._all)
    assert children and all(c.proc.pid != os.getpid() and c.proc.poll() is None for c in children)


def test_a_crash_fails_that_request_alone_while_others_decode(hooked):
    decoder = hooked(processes=2, timeout_s=30.0)
    good = V.image_bytes("PNG", (64, 64), seed=9)
    expected = decoder.image(good).digest
    results: list[object] = []
    stop = threading.Event()

    def steady() -> None:
        while not stop.is_set():
            try:
                results.append(decoder.image(good).digest)
            except Exception as exc:  # recorded: the assertion below says which
                results.append(exc)

    worker = threading.Thread(target=steady)
    worker.start()
    try:
        with pytest.raises(InvalidMedia, match=r"crashed the decoder \(killed by SIGABRT\)"):
            decoder.image(TEST_ABORT + b"PNG")
        with pytest.raises(InvalidMedia, match="crashed the decoder"):
            decoder.audio(TEST_ABORT, 16000)
        while len(results) < 3:
            stop.wait(0.01)
    finally:
        stop.set()
        worker.join()
    assert results and all(r == expected for r in results), results
    assert decoder.restarts == 2
    assert decoder.image(good).digest == expected  # the replacement child serves the next one


def test_a_crash_with_one_child_fails_only_the_crashing_request(hooked):
    decoder = hooked(processes=1, timeout_s=30.0)
    good = V.image_bytes("PNG", seed=4)
    out: dict[str, object] = {}
    crash = threading.Thread(target=lambda: out.setdefault("crash", _catch(lambda: decoder.image(TEST_ABORT))))
    crash.start()
    out["good"] = decoder.image(good)  # queued behind the crash or ahead of it: decoded either way
    crash.join()
    assert isinstance(out["crash"], InvalidMedia) and out["good"].nx == 64


def _catch(fn):
    try:
        return fn()
    except Exception as exc:
        return exc


def test_a_hung_decode_times_out_and_the_next_one_works(hooked):
    decoder = hooked(timeout_s=1.0)
    decoder.image(V.image_bytes("PNG"))  # the child is up: the timeout is the decode's alone
    with pytest.raises(InvalidMedia, match="longer than 5 seconds .* 1-second CPU cap"):
        decoder.image(TEST_HANG)
    assert decoder.image(V.image_bytes("PNG")).nx == 64
    assert decoder.restarts == 1


def test_hooks_are_off_without_the_environment_variable(decoder):
    _refused(decoder, TEST_ABORT, "invalid image: not an image")
    assert decoder.restarts == 0


def test_close_ends_the_children():
    decoder = MediaDecoder()
    decoder.image(V.image_bytes("PNG"))
    procs = [c.proc for c in decoder._all]
    decoder.close()
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(RuntimeError, match="closed"):
        decoder.image(V.image_bytes("PNG"))


def test_a_decoder_that_cannot_start_is_the_servers_fault_not_the_files(monkeypatch):
    import sys

    from localrun.errors import RuntimeUnavailable
    from localrun.runtimes.llamacpp.media import decoder as media_decode

    monkeypatch.setattr(media_decode._Child, "command", (sys.executable, "-c", "raise SystemExit(3)"))
    with MediaDecoder() as decoder:
        with pytest.raises(RuntimeUnavailable, match="could not start: exit code 3"):
            decoder.image(V.image_bytes("PNG"))


def test_a_seeded_fuzz_of_broken_files_gets_only_decodes_or_invalid_media(decoder):
    """Bit flips, cuts and splices of every taken format: the child answers each one (a picture or
    a named refusal), never an exception of another kind, and survives them all."""
    import random

    rng = random.Random(19)
    seeds = [V.image_bytes(fmt, (24, 16), seed=i) for i, fmt in enumerate(["PNG", "JPEG", "WEBP", "GIF", "BMP"])]
    clips = [V.wav_bytes(0.05, sampwidth=w) for w in (1, 2, 3, 4)] + [V.float_wav_bytes(0.05)]
    outcomes = {"ok": 0, "refused": 0}
    for i in range(300):
        base = bytearray(rng.choice(clips if i % 3 == 0 else seeds))
        for _ in range(rng.randint(1, 6)):
            base[rng.randrange(len(base))] = rng.randrange(256)
        if rng.random() < 0.4:
            base = base[: rng.randrange(1, len(base))]
        if rng.random() < 0.2:
            base += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        try:
            decoder.audio(bytes(base), 16000) if i % 3 == 0 else decoder.image(bytes(base))
            outcomes["ok"] += 1
        except InvalidMedia as exc:
            assert str(exc).startswith("invalid "), exc
            outcomes["refused"] += 1
    assert outcomes["refused"] > 50 and decoder.restarts == 0, outcomes
    assert decoder.image(seeds[0]).nx == 24
