"""The planner: which runtime runs a model, where, with how much context, and whether it fits.

``plan_placement`` turns (model record, hardware profile, runtime statuses, overrides) into
a :class:`~localrun.types.Plan` with a memory estimate, a verdict and the reasons in words.
It is pure: no I/O, no detection, so every decision is testable from JSON profiles.

The memory model it uses lives in :mod:`localrun.planning.placement`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localrun.errors import ConfigError, RuntimeUnavailable, UnknownRuntime
from localrun.planning.budget import DEVICE_LABELS, VRAM_MARGIN, hw_backend, memory_budget
from localrun.planning.context import fit_context, initial_context
from localrun.planning.hardware import HardwareProfile, fmt_bytes
from localrun.planning.media import with_media
from localrun.planning.offload import choose_kv, flash_reason, moe_options, prompt_cache_ram, split_options
from localrun.planning.placement import (
    KV_BYTES,
    N_UBATCH,
    TIGHT_RATIO,
    Budget,
    ModelShape,
    Placement,
    place,
    verdict_for,
    weights_bytes,
)
from localrun.planning.speculation import draft_plan, speculation_plan
from localrun.planning.vllm_fit import plan_for_vllm
from localrun.runtimes.base import RuntimeStatus
from localrun.types import Format, MemoryEstimate, ModelRecord, Plan

log = logging.getLogger(__name__)
__all__ = ["DEVICE_LABELS", "VRAM_MARGIN", "PlanOverrides", "plan_placement", "require_fit"]

#: Parallel llama.cpp slots the planner tries, most first, when the settings do not say.
AUTO_SLOTS = (4, 3, 2)
#: The order the planner tries the runtimes that can run a model's format (each runtime's own
#: ``formats`` says which can); a listed runtime not named here comes after them.
PREFERENCE = ("llama.cpp", "ollama", "vllm", "mlx", "mlc")


@dataclass(frozen=True)
class PlanOverrides:
    """What the user asked for on the command line or in a request; ``None`` leaves it to the planner."""

    runtime: str | None = None
    device: str | None = None
    n_ctx: int | None = None
    #: Who asked for n_ctx, in words for the plan's reasons ("--ctx", "options.num_ctx"…).
    ctx_source: str | None = None
    n_gpu_layers: int | None = None  # -1: all
    n_cpu_moe: int | None = None  # MoE: keep the experts of the first N layers in RAM (-1: all, --cpu-moe)
    threads: int | None = None
    kv_type: str | None = None
    parallel: int | None = None  # llama.cpp slots
    speculative: str | None = None  # llama.cpp speculative decoding: auto | off | ngram | draft
    draft: str | None = None  # its draft model: a store name or a .gguf path ("none": no draft)


def runtime_formats() -> dict[str, frozenset[Format]]:
    """Each listed runtime's formats, read from its class through the registry, in order of preference."""
    from localrun.runtimes import listed_runtimes, runtime_class

    names = sorted(listed_runtimes(), key=lambda n: PREFERENCE.index(n) if n in PREFERENCE else len(PREFERENCE))
    return {name: runtime_class(name).formats for name in names}


def choose_runtime(
    record: ModelRecord, statuses: Mapping[str, RuntimeStatus], asked: str | None
) -> tuple[str, list[str]]:
    """The runtime for this model: the one asked for (checked), else the first available for its format."""
    from localrun.runtimes import runtime_class, runtime_names

    listed = runtime_formats()
    if asked is not None:
        if asked not in runtime_names():
            raise UnknownRuntime(
                f"no runtime named {asked!r}", hint="try one of: " + ", ".join(runtime_names()), param="runtime"
            )
        if record.format not in runtime_class(asked).formats:
            able = [n for n, f in listed.items() if record.format in f]
            raise RuntimeUnavailable(
                f"{asked} cannot run {record.format.value.upper()} models like {record.name}",
                hint="use " + " or ".join(able),
                param="runtime",
            )
        status = _status(asked, statuses)
        if not status.available:
            raise RuntimeUnavailable(
                f"{asked} is not available here: {status.reason}", hint=status.fix, param="runtime"
            )
        return asked, []
    candidates = [n for n, f in listed.items() if record.format in f]
    for i, name in enumerate(candidates):
        if _status(name, statuses).available:
            skipped = [f"{n} is unavailable ({_status(n, statuses).reason})" for n in candidates[:i]]
            return name, [f"{'; '.join(skipped)}: using {_describe(_status(name, statuses))}"] if skipped else []
    why = "; ".join(f"{n}: {_status(n, statuses).reason}" for n in candidates)
    fixes = " or ".join(s.fix for n in candidates if (s := _status(n, statuses)).fix)
    raise RuntimeUnavailable(
        f"no runtime can run {record.name} ({record.format.value.upper()}) here — {why}", hint=fixes or None
    )


def _describe(status: RuntimeStatus) -> str:
    where = status.details.get("url")
    return " ".join(x for x in (status.name, status.version, f"at {where}" if where else None) if x)


def _status(name: str, statuses: Mapping[str, RuntimeStatus]) -> RuntimeStatus:
    from localrun.runtimes import runtime_class

    if name in statuses:
        return statuses[name]
    if getattr(runtime_class(name), "listed", True):
        return RuntimeStatus(name, False, reason="not probed")
    return RuntimeStatus(name, True)  # a runtime probing leaves out (the fake) runs when asked


def plan_placement(
    record: ModelRecord,
    hw: HardwareProfile,
    statuses: Mapping[str, RuntimeStatus],
    *,
    overrides: PlanOverrides | None = None,
    settings: Any = None,
) -> Plan:
    """Decide runtime, device, GPU layers, context and threads for ``record`` on ``hw``.

    Returns a plan even when the model does not fit (verdict ``wont-fit``, reasons say why);
    loading it is the caller's call (see :func:`require_fit`).

    Raises:
        UnknownRuntime: ``overrides.runtime`` names no runtime.
        RuntimeUnavailable: the runtime asked for (or every runtime for this format) cannot run
            here, or the device asked for is not available.
        ConfigError: an override out of range (device name, context, KV type).
    """
    ov = overrides or PlanOverrides()
    rt = settings.runtime if settings is not None else _default_runtime_settings()
    kv_asked = ov.kv_type.lower() if ov.kv_type else None
    if kv_asked is not None and kv_asked not in KV_BYTES:
        raise ConfigError(
            f"unknown KV cache type {ov.kv_type!r}", hint="use one of: " + ", ".join(KV_BYTES), param="kv_type"
        )
    runtime, reasons = choose_runtime(record, statuses, ov.runtime)
    status = _status(runtime, statuses)
    budget, cpu_why = memory_budget(runtime, status, hw, ov.device, ov.n_gpu_layers)
    shape = ModelShape.from_metadata(record.metadata)
    weights = weights_bytes(record)
    choice = initial_context(record.name, shape, settings, rt, budget, hw, ov.n_ctx, ov.ctx_source)
    n_ctx, ctx_reasons = choice.n_ctx, list(choice.reasons)
    layers = ov.n_gpu_layers
    if runtime in ("mlx", "mlc") and budget.backend != "cpu":
        layers = -1  # these runtimes place the whole model on their device
    asked = ov.parallel if ov.parallel is not None else getattr(rt, "parallel", None)
    moe_asked = ov.n_cpu_moe if runtime == "llama.cpp" else None

    def place_at(kv: str) -> tuple[Placement, tuple[int, list[str]]]:
        single = fit_context(
            lambda ctx: place(shape, weights, budget, ctx, n_gpu_layers=layers, kv_type=kv, n_cpu_moe=moe_asked),
            n_ctx,
            choice.adjustable,
        )
        if runtime != "llama.cpp":
            return single, (1, [])
        placed, n, why = _choose_slots(shape, weights, budget, single, asked, kv)
        return placed, (n, why)

    wants = runtime == "llama.cpp" and (not choice.adjustable or asked is not None)
    kv_type, placement, (slots, slot_reasons), kv_why = choose_kv(place_at, kv_asked, wants, n_ctx, shape.n_layer or 0)
    threads = ov.threads or rt.threads or hw.physical_cores or 1
    draft, speculate = None, None
    if runtime == "llama.cpp":
        speculate = speculation_plan(ov.speculative or getattr(rt, "speculative", None), slots)
        draft = draft_plan(
            record,
            speculate[0],
            ov.draft or getattr(rt, "draft", None),
            settings,
            n_ctx=slots * placement.n_ctx,
            kv_type=kv_type,
        )
        if draft is not None:
            placement = draft.beside(placement, budget)
    reasons += _device_reasons(placement, budget, cpu_why, shape, threads)
    gpu_opts: dict[str, Any] = {}
    if runtime == "llama.cpp":
        for opts, why in (moe_options(shape, budget, placement, moe_asked), split_options(budget, placement)):
            gpu_opts.update(opts)
            reasons += why
        reasons += [w for w in (flash_reason(budget, placement, kv_type), kv_why) if w]
        cache_ram, cache_why = prompt_cache_ram(settings, budget, placement)
        reasons.append(cache_why)
    else:
        cache_ram = 0
    reasons += ctx_reasons
    if placement.n_ctx < n_ctx:
        reasons.append(f"context reduced from {n_ctx:,} to {placement.n_ctx:,} to fit in memory")
    if not shape.knows_kv:
        reasons.append("the metadata lacks layer and head counts: the KV cache is not counted")
    reasons += slot_reasons
    verdict = verdict_for(placement.ratio)
    reasons += _verdict_reasons(placement, budget, verdict, shape)
    if runtime == "ollama":
        reasons.append("Ollama makes the final placement itself; these numbers are localrun's estimate")
    options: dict[str, Any] = {
        "ctx_source": choice.source,
        "placement": {
            "host_bytes": placement.host,
            "gpu_bytes": placement.gpu,
            "host_budget": budget.host,
            "gpu_budget": budget.gpu,
            "ratio": round(placement.ratio, 4),
            "layers_total": (shape.n_layer or 0) + 1,
            "backend": budget.backend,
            "unified": budget.unified,
        },
    }
    if runtime == "ollama":
        options.update(num_ctx=placement.n_ctx, num_gpu=placement.n_gpu_layers, num_thread=threads)
    if runtime == "llama.cpp":
        options.update(n_slots=slots, slot_ctx=placement.n_ctx, **gpu_opts)
        if status.details.get("backend"):  # the build next to what the machine could use, for `plan`'s words
            options.update(llama_backend=status.details["backend"], machine_backend=hw_backend(hw))
        options["speculative"] = speculate[0]
        options["kv_ram_bytes"] = cache_ram
        if settings is not None:  # state checkpoints per sequence where memory cannot be cut (checkpoints.py)
            options["checkpoints"] = settings.cache.checkpoints
        reasons.append(speculate[1])
        if draft is not None:
            options["draft"] = draft.path
            reasons.append(draft.why)
    plan = Plan(
        runtime=runtime,
        device=budget.backend if placement.n_gpu_layers else "cpu",
        n_gpu_layers=placement.n_gpu_layers,
        n_ctx=placement.n_ctx,
        n_threads=threads,
        n_batch=min(N_UBATCH, placement.n_ctx),
        kv_type=kv_type,
        memory=MemoryEstimate(
            weights=placement.weights, kv_cache=placement.kv, overhead=placement.overhead, prompt_cache=cache_ram
        ),
        verdict=verdict,
        reasons=tuple(reasons),
        options=options,
    )
    plan = with_media(plan, record) if runtime == "llama.cpp" else plan  # the projector's encoder, per image
    if runtime == "vllm":  # vLLM places the whole model on CUDA GPUs itself: size it the vLLM way
        plan = plan_for_vllm(plan, hw, status, asked_device=ov.device)
    return plan


def _choose_slots(
    shape: ModelShape, weights: int, budget: Budget, single: Placement, asked: int | None, kv_type: str
) -> tuple[Placement, int, list[str]]:
    """How many requests llama.cpp decodes at once, each with the plan's whole context.

    Asked for: that many, whatever the verdict says of it. Otherwise the most of
    AUTO_SLOTS whose extra KV cache keeps the plan comfortably within memory ("fits"),
    with the GPU layers of the single-request plan (offload speeds every request; slots
    only help when several arrive together); one when the model is tight already."""

    def at(n: int) -> Placement:
        return place(
            shape,
            weights,
            budget,
            single.n_ctx,
            n_gpu_layers=single.n_gpu_layers,
            kv_type=kv_type,
            n_seq=n,
            n_cpu_moe=single.n_cpu_moe if shape.is_moe else None,
        )

    if asked is not None:
        if asked < 1:
            raise ConfigError(f"parallel must be at least 1, not {asked}", param="parallel")
        return (
            at(asked),
            asked,
            [f"parallel {asked}, as asked: that many requests at once, each with the whole context"],
        )
    for n in AUTO_SLOTS:
        candidate = at(n)
        if candidate.ratio <= TIGHT_RATIO:
            extra = candidate.kv - single.kv
            return (
                candidate,
                n,
                [
                    f"{n} requests run at once, each with the whole context "
                    f"(+{fmt_bytes(extra)} of KV cache; --parallel or runtime.parallel to change)"
                ],
            )
    return single, 1, ["one request at a time: more parallel slots would not fit comfortably"]


def _default_runtime_settings() -> Any:
    from localrun.settings import RuntimeSettings

    return RuntimeSettings()


def _device_reasons(p: Placement, budget: Budget, cpu_why: str | None, shape: ModelShape, threads: int) -> list[str]:
    total = (shape.n_layer or 0) + 1
    if p.n_gpu_layers == 0:
        if cpu_why is None:  # a GPU was there, but not even one layer fits in it
            cpu_why = f"not even one layer fits in the {fmt_bytes(budget.gpu)} of usable {budget.label} memory"
        return [f"{cpu_why}: running on CPU with {threads} threads"]
    if p.n_gpu_layers >= total or not shape.n_layer:
        return [f"all {total} layers on {budget.label}: {fmt_bytes(p.gpu)} of {fmt_bytes(budget.gpu)} usable"]
    return [
        f"partial offload: {p.n_gpu_layers} of {total} layers on {budget.label} using "
        f"{fmt_bytes(p.gpu)} of {fmt_bytes(budget.gpu)}, the rest on CPU with {threads} threads"
    ]


def _verdict_reasons(p: Placement, budget: Budget, verdict: str, shape: ModelShape) -> list[str]:
    if verdict == "fits":
        return []
    host_share = p.host / budget.host if budget.host else float("inf")
    gpu_share = p.gpu / budget.gpu if p.gpu and budget.gpu else 0.0
    if budget.unified and p.gpu:
        where, need, have = "memory", p.host + p.gpu, budget.host
        if gpu_share > host_share and gpu_share >= (need / have if have else 0):
            where, need, have = "the GPU budget", p.gpu, budget.gpu
    elif gpu_share > host_share:
        where, need, have = "VRAM", p.gpu, budget.gpu
    else:
        where, need, have = "RAM", p.host, budget.host
    if verdict == "tight":
        return [f"tight: needs {fmt_bytes(need)} of the {fmt_bytes(have)} of {where} available ({need / have:.0%})"]
    return [
        f"does not fit: needs {fmt_bytes(need)} of {where} at context {p.n_ctx:,}, only {fmt_bytes(have)} is available"
    ]


def require_fit(plan: Plan, record: ModelRecord) -> Plan:
    """Raise :class:`WontFit` for a plan whose verdict is ``wont-fit``; return it otherwise."""
    if plan.verdict == "wont-fit":
        from localrun.errors import WontFit

        raise WontFit(
            f"{record.name} does not fit on this machine: " + "; ".join(plan.reasons),
            hint="pick a smaller quant or model, a shorter --ctx, or free some memory",
        )
    return plan
