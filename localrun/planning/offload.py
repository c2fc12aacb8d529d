"""The GPU half of a llama.cpp plan: which devices, how the layers and MoE experts split over them,
and the KV cache type that lets an asked-for context fit. The planner (:mod:`.planner`) calls these;
the memory model they read is :mod:`.placement`'s.

What goes to llama.cpp, as plan options its session reads at load time:

- ``tensor_overrides``: ``[pattern, buffer type]`` pairs (llama.cpp's ``-ot``), e.g. the routed
  experts of the first N layers to ``"CPU"`` (``--n-cpu-moe N``, or ``--cpu-moe`` for all);
- ``tensor_split`` (one share per GPU, by free memory) and ``main_gpu`` (the largest) when
  there are several GPUs;
- ``n_cpu_moe``, for the plan's words and ``--json``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from localrun.planning.hardware import fmt_bytes
from localrun.planning.placement import FLASH_BACKENDS, TIGHT_RATIO, Budget, ModelShape, Placement, tensor_overrides
from localrun.settings import default_kv_ram_bytes

log = logging.getLogger(__name__)

#: The KV cache type tried when f16 does not let the asked-for context or parallelism fit: q8_0 halves
#: the cache at a quality loss llama.cpp's own perplexity runs put near zero (q4_0 costs visibly more).
QUANT_KV = "q8_0"


def gpu_devices(status_devices: Sequence[dict] | None, gpus: Sequence[Any], margin: int) -> list[tuple[str, int]]:
    """(name, usable bytes) of each GPU llama.cpp will use, in llama.cpp's own order.

    llama.cpp's device list (the probe's ``details["devices"]``) is what the loader numbers
    ``tensor_split`` by (CUDA orders devices fastest first, NVML by PCI bus), so it wins when the
    probe has it; else the detected GPUs, in their order."""
    listed = [d for d in status_devices or () if d.get("type") == "gpu" and d.get("free")]
    if listed:
        return [(str(d.get("description") or d.get("name")), max(0, int(d["free"]) - margin)) for d in listed]
    return [(g.name, max(0, g.vram_free - margin)) for g in gpus]


def split_options(budget: Budget, placement: Placement) -> tuple[dict[str, Any], list[str]]:
    """``tensor_split`` and ``main_gpu`` for several GPUs: shares by usable memory, the largest as main."""
    free = budget.gpu_free
    if len(free) < 2 or not placement.n_gpu_layers or not sum(free):
        return {}, []
    total = sum(free)
    shares = [round(f / total, 4) for f in free]
    main = max(range(len(free)), key=lambda i: free[i])
    words = " / ".join(f"{s:.0%}" for s in shares)
    return {"tensor_split": shares, "main_gpu": main}, [
        f"layers split over {len(free)} GPUs by free memory: {words} (tensor_split; "
        f"{' + '.join(fmt_bytes(f) for f in free)} usable), main GPU {main}, the largest"
    ]


def moe_options(
    shape: ModelShape, budget: Budget, placement: Placement, asked: int | None
) -> tuple[dict[str, Any], list[str]]:
    """The tensor overrides that keep experts in RAM, and the line that says why."""
    m, n_layer = placement.n_cpu_moe, shape.n_layer or 0
    if not shape.is_moe or not placement.n_gpu_layers:
        if asked is None:
            return {}, []
        why = "the model has no routed experts" if not shape.is_moe else "no layer runs on a GPU"
        return {}, [f"--cpu-moe / --n-cpu-moe change nothing here: {why}"]
    expert_bytes = shape.expert_share * placement.weights
    if not m:
        return {"n_cpu_moe": 0}, [
            f"MoE with {shape.n_expert} experts: all of them on {budget.label} ({fmt_bytes(expert_bytes)} of experts)"
        ]
    on_cpu = expert_bytes * min(m, n_layer) / n_layer
    what = (
        ("all layers' experts" if m >= n_layer else f"the experts of the first {m} of {n_layer} layers")
        + f" ({fmt_bytes(on_cpu)}) stay "
        + ("with the CPU, outside Metal's working set" if budget.unified else "in RAM")
    )
    flag = "--cpu-moe" if m >= n_layer else f"--n-cpu-moe {m}"
    why = "as asked" if asked is not None else f"so attention, shared weights and the KV cache fit in {budget.label}"
    return {"n_cpu_moe": m, "tensor_overrides": tensor_overrides(m, n_layer)}, [
        f"MoE with {shape.n_expert} experts: {what} ({flag}, a tensor override to the CPU buffer type) {why}"
    ]


def flash_reason(budget: Budget, placement: Placement, kv_type: str) -> str | None:
    if not placement.n_gpu_layers or budget.backend not in FLASH_BACKENDS:
        return None
    if kv_type not in ("f16", "f32", "bf16"):
        return f"flash attention on: the {kv_type} KV cache needs it, and {budget.label} has it"
    return (
        f"flash attention: llama.cpp's auto, on where {budget.label} has the kernels "
        "(so no attention-score buffer is counted)"
    )


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


def prompt_cache_ram(settings: Any, budget: Budget, placement: Placement) -> tuple[int, str]:
    """(bytes, reason) of host RAM for the llama.cpp prompt cache's RAM tier: ``cache.kv_ram_bytes``
    where set, else :func:`default_kv_ram_bytes` of the RAM the placement leaves free. It is empty at
    load and fills as slots are evicted, so it goes in the plan's memory but not in its fit ratio."""
    configured = getattr(getattr(settings, "cache", None), "kv_ram_bytes", None)
    if configured is not None:
        size, source = int(configured), "cache.kv_ram_bytes"
    else:
        size, source = default_kv_ram_bytes(budget.host - placement.host), "a tenth of the RAM left free, at most 4 GiB"
    if not size:
        return 0, "prompt cache in RAM off (cache.kv_ram_bytes = 0): evicted prefixes go to disk or are lost"
    return size, f"prompt cache in RAM up to {fmt_bytes(size)} ({source}), filled by prefixes evicted from the slots"
