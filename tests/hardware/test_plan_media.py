"""``localrun plan`` for a model with a projector (issue 19): the encoder's compute buffer joins the
memory estimate and the fit, and the plan says what the projector takes and how many tokens one
image costs, by llama.cpp's rule for its projector type (tools/mtmd/clip.cpp
``clip_n_output_tokens``): Gemma 3's 896 px / 14 px patches pooled 4x4 give 256."""

from __future__ import annotations

import dataclasses

import pytest

from localrun.modelstore.projector_facts import ProjectorFacts, projector_facts
from localrun.planning.media import encoder_compute_bytes, image_cost
from localrun.planning.planner import plan_placement
from localrun.planning.render import render_plan
from localrun.types import META_PROJECTOR, FileEntry
from tests.hardware.helpers import LLAMA_8B, QWEN_05B, profile, record, statuses
from tests.support.projector_headers import AUDIO_ONLY, GEMMA3, OMNI, UNKNOWN, write_projector

MIB = 2**20


def _sz(size: int, patch: int) -> dict:
    return {"clip.vision.image_size": size, "clip.vision.patch_size": patch}


def _paired(tmp_path, keys, meta=QWEN_05B, *, weight_floats=1 << 20):
    """A record whose files are the model (by size) and a real projector file."""
    proj = write_projector(tmp_path / "mmproj.gguf", keys, weight_floats=weight_floats)
    base = record(meta)
    files = (*base.files, FileEntry(str(proj), proj.stat().st_size))
    return dataclasses.replace(base, files=files, metadata={**base.metadata, META_PROJECTOR: str(proj)})


def _facts(keys, **over) -> ProjectorFacts:
    vision = over.pop("vision", True)
    return ProjectorFacts(
        path="/p",
        vision=vision,
        audio=False,
        projector_type=keys.get("clip.projector_type"),
        vision_type=keys.get("clip.vision.projector_type") or keys.get("clip.projector_type"),
        audio_type=None,
        weights_bytes=0,
        n_params=0,
        keys={**keys, **over},
    )


@pytest.mark.parametrize(
    ("keys", "tokens", "note"),
    [
        (GEMMA3, 256, ""),  # (896/14)^2 = 4096 patches, pooled 4x4
        ({**GEMMA3, "clip.vision.projector.scale_factor": 2}, 1024, ""),  # tinygemma3's own factor
        ({"clip.projector_type": "mlp", "clip.vision.image_size": 336, "clip.vision.patch_size": 14}, 576, ""),
        ({"clip.projector_type": "ldpv2", "clip.vision.image_size": 336, "clip.vision.patch_size": 14}, 144, ""),
        (
            {
                "clip.projector_type": "idefics3",
                "clip.vision.image_size": 512,
                "clip.vision.patch_size": 16,
                "clip.vision.projector.scale_factor": 4,
            },
            64,
            "per tile",
        ),
        ({"clip.projector_type": "resampler", "clip.minicpmv_version": 2, **_sz(448, 14)}, 96, "per slice"),
        ({"clip.projector_type": "resampler", "clip.minicpmv_query_num": 64, **_sz(448, 14)}, 64, "per slice"),
        (
            {"clip.projector_type": "qwen2.5vl_merger", **_sz(1024, 14)},
            1296,
            "for a 1024x1024 image; varies with its size",
        ),
    ],
)
def test_tokens_per_image_follow_llama_cpps_rule_per_type(keys, tokens, note):
    cost = image_cost(_facts(keys))
    assert (cost.tokens, cost.note) == (tokens, note)


def test_an_unknown_type_or_missing_sizes_say_unknown():
    assert image_cost(_facts(UNKNOWN)).tokens is None
    assert "someday-vl" in image_cost(_facts(UNKNOWN)).words()
    bare = {"clip.projector_type": "gemma3"}
    assert image_cost(_facts(bare)).tokens is None and "unknown" in image_cost(_facts(bare)).note
    assert image_cost(_facts(AUDIO_ONLY, vision=False)).words() == "no image encoder"


def test_the_encoder_buffer_is_what_clip_allocates_with_flash_attention():
    full = encoder_compute_bytes(_facts(GEMMA3))
    # 4096 positions x (4304 + 3 x 1152) f32 plus the 896 px picture: llama.cpp's clip reported
    # 121 MiB for this shape (reserve_compute_meta, flash attention on); the estimate stays a bit above
    assert full == 4 * (4096 * (4304 + 3 * 1152) + 3 * 896 * 896)
    assert 121 * MIB < full < 140 * MIB
    half = encoder_compute_bytes(_facts({**GEMMA3, "clip.vision.image_size": 448}))
    assert 3.5 < full / half < 4.5  # a quarter of the patches, a quarter of the buffer
    assert encoder_compute_bytes(_facts(AUDIO_ONLY, vision=False)) == 0


def test_plan_counts_the_encoder_and_says_what_an_image_costs(tmp_path):
    rec = _paired(tmp_path, GEMMA3)
    text_only = plan_placement(record(QWEN_05B), profile("cpu_laptop_8gb"), statuses("cpu"))
    plan = plan_placement(rec, profile("cpu_laptop_8gb"), statuses("cpu"))
    compute = encoder_compute_bytes(projector_facts(rec))
    projector = 4 * (1 << 20)
    assert plan.memory.weights == text_only.memory.weights + (rec.size - record(QWEN_05B).size)
    assert plan.memory.weights - text_only.memory.weights >= projector  # the file's weights, counted once
    assert plan.memory.overhead == text_only.memory.overhead + compute
    media = plan.options["media"]
    assert media["image_tokens"] == 256 and media["takes"] == ["images"] and media["projector_bytes"] == projector
    file_bytes = rec.size - record(QWEN_05B).size
    assert (
        plan.options["placement"]["host_bytes"] == text_only.options["placement"]["host_bytes"] + file_bytes + compute
    )
    assert any("one image costs 256 tokens" in r for r in plan.reasons)
    lines = render_plan(plan, rec)
    (line,) = [x for x in lines if x.startswith("media")]
    assert line == "media     takes images, 256 tokens per image, projector 4 MiB, encoder buffer ~130 MiB"
    assert "media" not in text_only.options and not [
        x for x in render_plan(text_only, record(QWEN_05B)) if "media" in x
    ]


def test_the_encoder_can_tip_a_tight_fit(tmp_path):
    """A model that just fits in RAM does not once the encoder's buffer is counted."""
    rec = _paired(tmp_path, GEMMA3, meta=LLAMA_8B)
    hw = profile("cpu_laptop_8gb")
    before = plan_placement(record(LLAMA_8B), hw, statuses("cpu"))
    after = plan_placement(rec, hw, statuses("cpu"))
    assert after.options["placement"]["ratio"] > before.options["placement"]["ratio"]
    order = ("fits", "tight", "wont-fit")
    assert order.index(after.verdict) >= order.index(before.verdict)


def test_audio_and_mixed_projectors_say_what_they_take(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "o").mkdir()
    audio = plan_placement(_paired(tmp_path / "a", AUDIO_ONLY), profile("cpu_laptop_8gb"), statuses("cpu"))
    assert audio.options["media"]["takes"] == ["audio"] and audio.options["media"]["compute_bytes"] == 0
    assert [x for x in render_plan(audio, record(QWEN_05B)) if x.startswith("media")] == [
        "media     takes audio, projector 4 MiB"
    ]
    omni = plan_placement(_paired(tmp_path / "o", OMNI), profile("cpu_laptop_8gb"), statuses("cpu"))
    assert omni.options["media"]["takes"] == ["images", "audio"]
    assert omni.options["media"]["image_tokens_note"] == "for a 1024x1024 image; varies with its size"


def test_a_gpu_plan_puts_the_encoder_beside_the_layers(tmp_path):
    rec = _paired(tmp_path, GEMMA3)
    plain = plan_placement(record(QWEN_05B), profile("rtx4090_desktop"), statuses("cuda"))
    plan = plan_placement(rec, profile("rtx4090_desktop"), statuses("cuda"))
    compute = plan.options["media"]["compute_bytes"]
    assert plan.n_gpu_layers == plain.n_gpu_layers > 0
    assert plan.options["placement"]["gpu_bytes"] >= plain.options["placement"]["gpu_bytes"] + compute
