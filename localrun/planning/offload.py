"""The GPUs a plan may fill and the KV cache type that lets an asked-for context fit. The budget
(:mod:`.budget`) and the planner (:mod:`.planner`) call these; the memory model they read is
:mod:`.placement`'s. How llama.cpp splits its layers and MoE experts over the GPUs is its
policy's (:mod:`.policies.llamacpp`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from localrun.planning.hardware import fmt_bytes
from localrun.planning.placement import TIGHT_RATIO, Placement

log = logging.getLogger(__name__)

#: The KV cache type tried when f16 does not let the asked-for context or parallelism fit: q8_0 halves
#: the cache at a quality loss llama.cpp's own perplexity runs put near zero (q4_0 costs visibly more).
QUANT_KV = "q8_0"


def gpu_devices(
    status_devices: Sequence[dict[str, Any]] | None, gpus: Sequence[Any], margin: int
) -> list[tuple[str, int]]:
    """(name, usable bytes) of each GPU llama.cpp will use, in llama.cpp's own order.

    llama.cpp's device list (the probe's ``details["devices"]``) is what the loader numbers
    ``tensor_split`` by (CUDA orders devices fastest first, NVML by PCI bus), so it wins when the
    probe has it; else the detected GPUs, in their order."""
    listed = [d for d in status_devices or () if d.get("type") == "gpu" and d.get("free")]
    if listed:
        return [(str(d.get("description") or d.get("name")), max(0, int(d["free"]) - margin)) for d in listed]
    return [(g.name, max(0, g.vram_free - margin)) for g in gpus]


def choose_kv(
    place_at: Callable[[str], tuple[Placement, Any]], kv_asked: str | None, wants: bool, n_ctx: int, n_layer: int
) -> tuple[str, Placement, Any, str | None]:
    """The KV cache type: the one asked for, else f16 unless only ``QUANT_KV`` lets the asked-for
    context or parallelism fit (``wants``: the user set one of them; ``n_ctx``: the context wanted).

    ``place_at(kv_type)`` gives (placement, whatever else the caller keeps) for a type. q8_0 wins
    when f16 does not fit, shortens the context or keeps part of the model off the GPU, and q8_0
    does better on that count without doing worse on another. Returns (type, placement, extra, why)."""
    if kv_asked is not None:
        return (kv_asked, *place_at(kv_asked), None)
    p16, extra16 = place_at("f16")
    short = p16.ratio > 1.0 or p16.n_ctx < n_ctx
    partial = bool(p16.n_gpu_layers) and (p16.n_gpu_layers <= n_layer or p16.n_cpu_moe > 0)
    if not wants or not (short or partial):
        return "f16", p16, extra16, None
    p8, extra8 = place_at(QUANT_KV)
    no_worse = p8.n_ctx >= p16.n_ctx and p8.n_gpu_layers >= p16.n_gpu_layers and p8.n_cpu_moe <= p16.n_cpu_moe
    gains = (
        (p16.ratio > 1.0 >= p8.ratio)
        or p8.n_ctx > p16.n_ctx
        or p8.n_gpu_layers > p16.n_gpu_layers
        or p8.n_cpu_moe < p16.n_cpu_moe
    )
    if not (no_worse and gains):
        return "f16", p16, extra16, None
    verdict = "fits" if p8.ratio <= TIGHT_RATIO else "fits tightly" if p8.ratio <= 1.0 else "comes closer to fitting"
    kept = "the whole context" if short else "more of the model on the GPU"
    why = (
        f"KV cache {QUANT_KV}: the asked-for context and parallelism need {fmt_bytes(p16.kv)} of f16 cache, "
        f"{fmt_bytes(p8.kv)} as {QUANT_KV}, which {verdict} with {kept} (--kv-type f16 keeps f16)"
    )
    return QUANT_KV, p8, extra8, why
