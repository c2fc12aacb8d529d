"""The plan's tokens-per-image is llama.cpp's own count (issue 19): for real Gemma-3-layout projectors
paired with the real Gemma 3 270M, what ``localrun plan`` says one image costs equals the tokens
mtmd gives the image chunk (``mtmd_input_chunk_get_n_tokens``), for the default 4x4 pool and
another merge factor. The projectors are the random-weight fixtures of tests/support/vision.py,
built in set-up and cached in the test cache."""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest

from localrun.modelstore.projector_facts import projector_facts
from localrun.planning.media import image_cost
from localrun.types import META_PROJECTOR, Format, ModelRecord
from tests.conftest import needs_llama

vision = pytest.importorskip("tests.support.vision", reason="the loadable projector fixtures (vis-media)")

pytestmark = [needs_llama, pytest.mark.slow]


@pytest.fixture(scope="module")
def text_model(gemma_gguf):
    import llama_cpp

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(gemma_gguf).encode(), llama_cpp.llama_model_default_params())
    assert model
    yield model
    llama_cpp.llama_model_free(model)


def _mtmd_image_tokens(model, projector, size=(48, 64)) -> int:
    import llama_cpp.mtmd_cpp as M

    params = M.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings, params.warmup = False, 2, False, False
    ctx = M.mtmd_init_from_file(str(projector).encode(), model, params)
    assert ctx, projector
    chunks = M.mtmd_input_chunks_init()
    try:
        rgb = np.ascontiguousarray(np.random.default_rng(0).integers(0, 256, (*size, 3), dtype=np.uint8))
        bitmap = M.mtmd_bitmap_init(size[1], size[0], rgb.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
        text = b"Look: <__media__> what?"
        inp = M.mtmd_input_text(text, len(text), True, True)
        assert M.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), (M.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        M.mtmd_bitmap_free(bitmap)
        counts = [
            M.mtmd_input_chunk_get_n_tokens(M.mtmd_input_chunks_get(chunks, i))
            for i in range(M.mtmd_input_chunks_size(chunks))
            if M.mtmd_input_chunk_get_type(M.mtmd_input_chunks_get(chunks, i)) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE
        ]
        assert len(counts) == 1, counts
        return counts[0]
    finally:
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_free(ctx)


@pytest.mark.parametrize("n_merge", [2, 4])
def test_plan_says_what_mtmd_counts(text_model, gemma_gguf, n_merge):
    shape = vision.TINY if vision.TINY.n_merge == n_merge else dataclasses.replace(vision.TINY, name=f"tiny-m{n_merge}")
    shape = dataclasses.replace(shape, n_merge=n_merge)
    assert shape.tokens_per_image == (64 // 8 // n_merge) ** 2
    projector = vision.vision_projector(shape)
    record = ModelRecord(
        name="gemma-vision", format=Format.GGUF, path=str(gemma_gguf), metadata={META_PROJECTOR: str(projector)}
    )
    planned = image_cost(projector_facts(record))
    assert planned.note == ""
    assert planned.tokens == _mtmd_image_tokens(text_model, projector) == shape.tokens_per_image
