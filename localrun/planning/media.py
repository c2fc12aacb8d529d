"""What a model's projector adds to a plan: memory for its encoder and how many tokens an image costs.

The projector's weights are already in the model's weights (its file is one of the record's
files, so ``record.size`` counts it); what the planner does not see is the encoder's compute
buffer, the activations of one image's pass through the vision tower, which llama.cpp's clip
allocates for its largest image (at a warm-up, or at the first encode). That goes into the
overhead here, and the fit is judged again with it.

An image's token count follows llama.cpp's ``clip_n_output_tokens`` (tools/mtmd/clip.cpp) per
projector type, at the projector's own image size (the size fixed-resolution encoders resize
every picture to). Types whose count depends on the picture's size say so, with the count for
a square picture of that size; an unknown type says "unknown" rather than guess.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from localrun.modelstore.projector_facts import ProjectorFacts, projector_facts
from localrun.planning.hardware import fmt_bytes
from localrun.planning.placement import verdict_for
from localrun.types import MemoryEstimate, ModelRecord, Plan

#: Every patch becomes a token (LLaVA's MLP projectors).
_ALL_PATCHES = frozenset({"mlp", "mlp_norm", "janus_pro"})
#: Patches pooled 2x2 (LDP, MobileVLM; GLM-Edge adds its begin/end-of-image tokens).
_QUARTER = frozenset({"ldp", "ldpv2", "adapter"})
#: Both sides shrunk by the merge factor (``clip.vision.projector.scale_factor``) with this default.
_MERGED = {"gemma3": 4, "idefics3": 1, "internvl": 1, "llama4": 1, "nemotron_v2_vl": 1}
#: Those that cut a large picture into tiles plus an overview: the count is per tile.
_TILED = frozenset({"idefics3", "internvl", "llama4"})
#: Dynamic resolution, two 2x2 merges (Qwen2-VL family and kin).
_DYNAMIC_QWEN = frozenset({"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "glm4v", "mimovl", "youtuvl"})
#: MiniCPM-V's resampler: a fixed query count, by version when the file does not say it.
_MINICPMV_QUERIES = {2: 96, 3: 64, 4: 64, 5: 64, 6: 64, 100045: 64}
_F32 = 4


@dataclass(frozen=True)
class ImageCost:
    """Tokens one image takes in the model's context, and in what sense the number holds."""

    tokens: int | None  # None: unknown for this projector type
    note: str  # "" (exact), "per tile", "for a 1024x1024 image; varies with its size", "unknown…"

    def words(self) -> str:
        if self.tokens is None:
            return self.note
        return f"{self.tokens:,} tokens" + (f" {self.note}" if self.note else "")


def image_cost(facts: ProjectorFacts) -> ImageCost:
    """Tokens per image for ``facts``' vision encoder (see the module doc for the rule's source)."""
    proj = facts.vision_type
    size, patch = facts.vision_int("image_size"), facts.vision_int("patch_size")
    if not facts.vision:
        return ImageCost(None, "no image encoder")
    if proj is None or not size or not patch:
        return ImageCost(None, "unknown (the projector does not say its image and patch size)")
    side = size // patch
    n = side * side
    merge = facts.vision_int("projector.scale_factor")
    if proj in _ALL_PATCHES:
        return ImageCost(n, "")
    if proj in _QUARTER:
        return ImageCost(n // 4 + (2 if proj == "adapter" else 0), "")
    if proj in _MERGED:
        m = merge or _MERGED[proj]
        return ImageCost(n // (m * m), "per tile" if proj in _TILED else "")
    if proj == "resampler":
        queries = facts.keys.get("clip.minicpmv_query_num")
        version = facts.keys.get("clip.minicpmv_version") or 2
        count = queries if isinstance(queries, int) and queries > 0 else _MINICPMV_QUERIES.get(version)
        return ImageCost(count, "per slice") if count else ImageCost(None, f"unknown (MiniCPM-V version {version})")
    if proj == "gemma3nv":
        return ImageCost(size // patch, "")
    if proj in _DYNAMIC_QWEN:
        m = facts.vision_int("spatial_merge_size") or 2
        return ImageCost((side // m) ** 2, f"for a {size}x{size} image; varies with its size")
    return ImageCost(None, f"unknown for projector type {proj!r}")


#: The pixels a picture keeps (``decode_pixels``) where the projector's type does not say how many
#: it consumes: tiling and dynamic-resolution encoders take large pictures, up to about this.
_DECODE_PIXELS_ANY = 4096 * 4096


def decode_pixels(facts: ProjectorFacts) -> int:
    """How many pixels of a picture the projector consumes: the decoder scales larger pictures down
    to this (shape kept) before they reach the worker. A fixed-resolution encoder (Gemma 3, LLaVA's,
    every type with one image per picture and no tiles) resizes every picture to ``image_size``
    squared; twice that keeps both sides at least ``image_size`` for shapes up to 2:1, so the
    encoder's own resize loses nothing it would have had. Tiled, sliced and dynamic encoders keep
    up to :data:`_DECODE_PIXELS_ANY`."""
    proj, size = facts.vision_type, facts.vision_int("image_size")
    fixed = proj in _ALL_PATCHES or proj in _QUARTER or proj == "gemma3nv"
    fixed = fixed or (proj in _MERGED and proj not in _TILED)
    if fixed and size:
        return min(2 * size * size, _DECODE_PIXELS_ANY)
    return _DECODE_PIXELS_ANY


def encoder_compute_bytes(facts: ProjectorFacts) -> int:
    """The vision encoder's compute buffer for one image, as llama.cpp's clip allocates it with flash
    attention (its default where the backend has it): per patch position the widest step holds the
    feed-forward activations and three embedding-wide tensors, f32, plus the input picture.

    Measured (``reserve_compute_meta`` in clip.cpp's log) on a SigLIP-400M-shaped Gemma 3 projector
    at 896 px: 121 MiB with flash attention (this estimate: 130 MiB), 1,132 MiB without it, when
    every head's 4096x4096 score matrix is held as well.
    """
    if not facts.vision:
        return 0
    size, patch = facts.vision_int("image_size"), facts.vision_int("patch_size")
    if not size or not patch:
        return 0
    n_pos = (size // patch) ** 2
    n_embd, n_ff = facts.vision_int("embedding_length") or 0, facts.vision_int("feed_forward_length") or 0
    return _F32 * (n_pos * (n_ff + 3 * n_embd) + 3 * size * size)


def with_media(plan: Plan, record: ModelRecord) -> Plan:
    """``plan`` with the projector's compute buffer in its memory and fit, and what one image costs
    in ``options["media"]`` and the reasons; ``plan`` itself for a model without a projector."""
    facts = projector_facts(record)
    if facts is None:
        return plan
    compute = encoder_compute_bytes(facts)
    cost = image_cost(facts)
    takes = [k for k, on in (("images", facts.vision), ("audio", facts.audio)) if on]
    media = {
        "projector": facts.path,
        "projector_type": facts.projector_type,
        "takes": takes,
        "projector_bytes": facts.weights_bytes,
        "compute_bytes": compute,
        "image_tokens": cost.tokens,
        "image_tokens_note": cost.note,
        "decode_pixels": decode_pixels(facts),
    }
    options = {**plan.options, "media": media}
    verdict, memory = plan.verdict, plan.memory
    placed = dict(options.get("placement") or {})
    if compute and memory is not None:
        memory = dataclasses.replace(memory, overhead=memory.overhead + compute)
        ratio = _ratio_with(placed, compute, on_gpu=bool(plan.n_gpu_layers and placed.get("gpu_bytes")))
        if ratio is not None:
            options["placement"] = {**placed, "ratio": round(ratio, 4)}
            verdict = max(plan.verdict, verdict_for(ratio), key=_VERDICTS.index)
    reason = (
        f"the projector ({fmt_bytes(facts.weights_bytes)} of weights, in the weights above) takes "
        + " and ".join(takes or ["nothing"])
        + (f"; its encoder needs about {fmt_bytes(compute)} more while it runs" if compute else "")
        + (f"; one image costs {cost.words()}" if facts.vision else "")
    )
    memory = memory or MemoryEstimate(0, 0, compute)
    return dataclasses.replace(plan, memory=memory, verdict=verdict, reasons=(*plan.reasons, reason), options=options)


_VERDICTS = ("fits", "tight", "wont-fit")


def _ratio_with(placed: dict[str, Any], extra: int, *, on_gpu: bool) -> float | None:
    """The placement's memory pressure with ``extra`` bytes where the encoder runs: beside the
    model's first layers, so on the GPU when any are there. The GPU's share of the pressure grows
    in proportion to its bytes (exact within its budget, close past it); None without a placement."""
    ratio = placed.get("ratio")
    if not isinstance(ratio, (int, float)):
        return None
    if on_gpu:
        placed["gpu_bytes"] = placed["gpu_bytes"] + extra
        return float(ratio * placed["gpu_bytes"] / max(placed["gpu_bytes"] - extra, 1))
    host, budget = placed.get("host_bytes") or 0, placed.get("host_budget") or 0
    if not budget:
        return None
    placed["host_bytes"] = host + extra
    return max(ratio, (host + extra) / budget)


def media_lines(plan: Plan) -> list[str]:
    """The plan's ``media`` line for ``localrun plan`` (none for a text-only model)."""
    media = plan.options.get("media")
    if not media:
        return []
    cost = ImageCost(media.get("image_tokens"), media.get("image_tokens_note") or "")
    parts = [f"takes {' and '.join(media.get('takes') or ['nothing'])}"]
    if "images" in (media.get("takes") or ()):
        parts.append(f"{cost.words()} per image")
    parts.append(f"projector {fmt_bytes(media.get('projector_bytes') or 0)}")
    if media.get("compute_bytes"):
        parts.append(f"encoder buffer ~{fmt_bytes(media['compute_bytes'])}")
    return ["media     " + ", ".join(parts)]
