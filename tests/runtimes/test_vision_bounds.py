"""A request's pictures reach the worker scaled to what the projector consumes, within a budget of
decoded bytes per request (real llama.cpp, Gemma 3 270M with the tiny fixture projector).

Before, each picture was decoded at full size and copied into the worker (a 64-MP PNG of 190 KB
became 192 MB of RGB, three times over): 32 of them in one 6 MB request killed the worker.
Measured with 64-MP PNGs at Gemma 3's SigLIP fit (2 × 896²): 4 images took the worker's peak RSS
from 438 to 1,562 MiB before; 32 images now peak at 601 MiB.
"""

from __future__ import annotations

import pytest

from localrun.errors import InvalidMedia
from localrun.planning.media import decode_pixels
from localrun.types import MEDIA_MARKER, Cancel, ChatRequest, Media, Message, Plan, Sampling
from tests.conftest import needs_llama

FIT = 2 * 64 * 64  # the tiny projector's 64-px encoder
BUDGET = 100_000


def _req(n: int, size=(1000, 800)) -> ChatRequest:
    from tests.support.vision import image_bytes

    media = tuple(Media("image", image_bytes("PNG", size, seed=k), "image/png") for k in range(n))
    msg = Message("user", MEDIA_MARKER * n + " What is in them?", media=media)
    return ChatRequest(messages=(msg,), sampling=Sampling(temperature=0.0, max_tokens=1))


def test_the_planner_says_how_many_pixels_the_projector_consumes(gemma_vision):
    from localrun.modelstore.projector_facts import projector_facts

    facts = projector_facts(gemma_vision.record())
    assert facts is not None
    assert decode_pixels(facts) == FIT


@needs_llama
@pytest.mark.llama
def test_pictures_are_scaled_for_the_projector_and_a_request_has_a_budget(gemma_vision):
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime

    options = {"n_slots": 1, "media": {"decode_pixels": FIT}, "media_budget_bytes": BUDGET}
    session = LlamaCppRuntime().load(
        gemma_vision.record(), Plan(runtime="llama.cpp", n_ctx=2048, n_threads=2, options=options)
    )
    try:
        # 3 × 1000×800 is 7.2 MB of RGB at full size; scaled to the fit it is 3 × ~24 KB.
        list(session.chat(_req(3), Cancel()))
        with pytest.raises(InvalidMedia, match="budget of one request") as info:
            list(session.chat(_req(5), Cancel()))
        assert "item 5 of 5" in str(info.value)
        list(session.chat(_req(1), Cancel()))  # the session is well after a refusal
    finally:
        session.close()
