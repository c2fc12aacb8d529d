"""The projector fixtures load and run in the real mtmd: each pairs with the real Gemma 3 270M, says
what it supports, and turns one image / one clip into embeddings that depend on the input.

Straight through ``llama_cpp.mtmd_cpp``, below any localrun code, so a failure here blames the
fixture, not the engine built on it.
"""

from __future__ import annotations

import ctypes
import hashlib
import time

import numpy as np
import pytest

from tests.conftest import needs_llama
from tests.support import vision

pytestmark = needs_llama


class Mtmd:
    """One mtmd context on one loaded text model: tokenize a prompt with media, encode a chunk."""

    def __init__(self, model, projector, n_threads: int = 2) -> None:
        import llama_cpp.mtmd_cpp as M

        self.M = M
        params = M.mtmd_context_params_default()
        params.use_gpu = False
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = False
        self.ctx = M.mtmd_init_from_file(str(projector).encode(), model, params)
        assert self.ctx, f"mtmd_init_from_file refused {projector}"

    def close(self) -> None:
        self.M.mtmd_free(self.ctx)

    def image_bitmap(self, rgb: np.ndarray):
        ny, nx, _ = rgb.shape
        data = np.ascontiguousarray(rgb, dtype=np.uint8)
        return self.M.mtmd_bitmap_init(nx, ny, data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))

    def audio_bitmap(self, samples: np.ndarray):
        data = np.ascontiguousarray(samples, dtype=np.float32)
        return self.M.mtmd_bitmap_init_from_audio(len(data), data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))

    def encode(self, bitmap, text: str = "Look: <__media__> what is it?") -> dict:
        """Tokenize ``text`` with one bitmap; return the media chunk's facts and its embeddings."""
        M = self.M
        chunks = M.mtmd_input_chunks_init()
        try:
            inp = M.mtmd_input_text(text.encode(), len(text.encode()), True, True)
            bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(bitmap)
            assert M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), bitmaps, 1) == 0
            kinds = []
            media = None
            for i in range(M.mtmd_input_chunks_size(chunks)):
                chunk = M.mtmd_input_chunks_get(chunks, i)
                kinds.append(M.mtmd_input_chunk_get_type(chunk))
                if kinds[-1] != M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    media = chunk
            assert media is not None, kinds
            n_tokens = M.mtmd_input_chunk_get_n_tokens(media)
            started = time.perf_counter()
            assert M.mtmd_encode_chunk(self.ctx, media) == 0
            encode_s = time.perf_counter() - started
            embd = M.mtmd_get_output_embd(self.ctx)
            width = vision.GEMMA3_270M_N_EMBD
            out = np.ctypeslib.as_array(embd, shape=(n_tokens * width,)).reshape(n_tokens, width).copy()
            chunk_id = M.mtmd_input_chunk_get_id(media)
            return {"kinds": kinds, "n_tokens": n_tokens, "id": chunk_id, "embd": out, "encode_s": encode_s}
        finally:
            M.mtmd_input_chunks_free(chunks)
            M.mtmd_bitmap_free(bitmap)


@pytest.fixture(scope="module")
def text_model(gemma_gguf):
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(gemma_gguf).encode(), params)
    assert model
    assert llama_cpp.llama_model_n_embd(model) == vision.GEMMA3_270M_N_EMBD
    yield model
    llama_cpp.llama_model_free(model)


@pytest.fixture(scope="module")
def tiny_vision(text_model, gemma3_tiny_projector):
    mtmd = Mtmd(text_model, gemma3_tiny_projector)
    yield mtmd
    mtmd.close()


def _noise(seed: int, size=(48, 64)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def test_tiny_projector_pairs_with_gemma_and_sees_only_images(tiny_vision):
    assert tiny_vision.M.mtmd_support_vision(tiny_vision.ctx)
    assert not tiny_vision.M.mtmd_support_audio(tiny_vision.ctx)


def test_an_image_becomes_its_tokens_between_text_chunks(tiny_vision):
    M = tiny_vision.M
    got = tiny_vision.encode(tiny_vision.image_bitmap(_noise(0)))
    assert got["n_tokens"] == vision.TINY.tokens_per_image == 16
    assert got["kinds"] == [M.MTMD_INPUT_CHUNK_TYPE_TEXT, M.MTMD_INPUT_CHUNK_TYPE_IMAGE, M.MTMD_INPUT_CHUNK_TYPE_TEXT]
    assert np.isfinite(got["embd"]).all() and np.abs(got["embd"]).sum() > 0


def test_two_images_differ_and_the_same_image_encodes_the_same(tiny_vision):
    a1 = tiny_vision.encode(tiny_vision.image_bitmap(_noise(1)))["embd"]
    b = tiny_vision.encode(tiny_vision.image_bitmap(_noise(2)))["embd"]
    a2 = tiny_vision.encode(tiny_vision.image_bitmap(_noise(1)))["embd"]
    assert np.array_equal(a1, a2)
    assert not np.allclose(a1, b)


def test_image_size_does_not_change_the_token_count(tiny_vision):
    """Gemma 3 resizes every image to the projector's square: 16 tokens for any shape."""
    wide = tiny_vision.encode(tiny_vision.image_bitmap(_noise(3, size=(20, 300))))
    assert wide["n_tokens"] == vision.TINY.tokens_per_image


def test_audio_projector_takes_a_clip_at_16khz(text_model, gemma3_audio_projector):
    mtmd = Mtmd(text_model, gemma3_audio_projector)
    try:
        M = mtmd.M
        assert M.mtmd_support_audio(mtmd.ctx) and not M.mtmd_support_vision(mtmd.ctx)
        assert M.mtmd_get_audio_sample_rate(mtmd.ctx) == vision.AUDIO_SAMPLE_RATE
        t = np.arange(vision.AUDIO_SAMPLE_RATE) / vision.AUDIO_SAMPLE_RATE
        tone = lambda f: (0.5 * np.sin(2 * np.pi * f * t)).astype(np.float32)  # noqa: E731
        a = mtmd.encode(mtmd.audio_bitmap(tone(440.0)))
        b = mtmd.encode(mtmd.audio_bitmap(tone(880.0)))
        assert a["kinds"][1] == M.MTMD_INPUT_CHUNK_TYPE_AUDIO
        assert a["n_tokens"] == b["n_tokens"] > 0
        assert np.isfinite(a["embd"]).all()
        assert not np.allclose(a["embd"], b["embd"])
    finally:
        mtmd.close()


def test_fixtures_are_cached_and_rebuilt_when_stale(tmp_path):
    first = vision.vision_projector(vision.TINY, cache=tmp_path)
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    mtime = first.stat().st_mtime_ns
    assert vision.vision_projector(vision.TINY, cache=tmp_path).stat().st_mtime_ns == mtime
    first.write_bytes(b"GGUF not really")  # a torn or foreign file is rebuilt, not trusted
    again = vision.vision_projector(vision.TINY, cache=tmp_path)
    assert hashlib.sha256(again.read_bytes()).hexdigest() == digest  # seeded: the same bytes


def test_pair_gives_a_record_that_names_its_projector(gemma_vision):
    from localrun.types import META_PROJECTOR

    record = gemma_vision.record("gv")
    assert record.metadata[META_PROJECTOR] == str(gemma_vision.projector)
    assert {f.path for f in record.files} == {str(gemma_vision.model), str(gemma_vision.projector)}


def test_media_helpers_make_real_files():
    import io
    import wave

    from PIL import Image

    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP"):
        with Image.open(io.BytesIO(vision.image_bytes(fmt))) as img:
            assert img.format == fmt and img.size == (64, 48)
    assert vision.image_bytes("PNG", seed=1) != vision.image_bytes("PNG", seed=2)
    with wave.open(io.BytesIO(vision.wav_bytes(0.5, sampwidth=3))) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnframes()) == (16000, 3, 8000)
    assert vision.float_wav_bytes()[20:22] == b"\x03\x00"  # WAVE_FORMAT_IEEE_FLOAT
