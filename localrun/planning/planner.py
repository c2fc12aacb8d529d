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
from typing import TYPE_CHECKING, Any

from localrun.errors import ConfigError, RuntimeUnavailable, UnknownRuntime
from localrun.planning.budget import DEVICE_LABELS, VRAM_MARGIN, memory_budget
from localrun.planning.context import fit_context, initial_context
from localrun.planning.hardware import HardwareProfile, fmt_bytes
from localrun.planning.offload import choose_kv
from localrun.planning.placement import (
    KV_BYTES,
    N_UBATCH,
    Budget,
    ModelShape,
    Placement,
    place,
    verdict_for,
    weights_bytes,
)
from localrun.planning.policies import Fit, PlacementPolicy, PlanJob, Slots, Tuning, policy_for
from localrun.runtimes.base import RuntimeStatus
from localrun.types import Format, MemoryEstimate, ModelRecord, Plan

if TYPE_CHECKING:
    from localrun.settings import RuntimeSettings

log = logging.getLogger(__name__)
__all__ = ["DEVICE_LABELS", "VRAM_MARGIN", "PlanOverrides", "plan_placement", "require_fit"]

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
    loading it is the caller's call (see :func:`require_fit`). What differs between runtimes
    is asked of the runtime's placement policy (:mod:`localrun.planning.policies`).

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
    policy = policy_for(runtime)
    job = _job(record, hw, runtime, _status(runtime, statuses), policy, ov, settings, rt)
    fit = _fit(job, policy, kv_asked)
    plan = _assemble(runtime, job, fit, policy.tune(job, fit), reasons)
    return policy.finish(plan, job)


def _job(
    record: ModelRecord,
    hw: HardwareProfile,
    runtime: str,
    status: RuntimeStatus,
    policy: PlacementPolicy,
    ov: PlanOverrides,
    settings: Any,
    rt: Any,
) -> PlanJob:
    """The budget, the model's shape and the context to start from, with what the user asked for
    (``ov``, else the runtime settings ``rt``)."""
    backend = policy.backend(status, hw)
    budget, cpu_why = memory_budget(runtime, backend, status, hw, ov.device, ov.n_gpu_layers)
    shape = ModelShape.from_metadata(record.metadata)
    return PlanJob(
        record=record,
        hw=hw,
        status=status,
        settings=settings,
        budget=budget,
        cpu_why=cpu_why,
        shape=shape,
        weights=weights_bytes(record),
        choice=initial_context(record.name, shape, settings, rt, budget, hw, ov.n_ctx, ov.ctx_source),
        threads=ov.threads or rt.threads or hw.physical_cores or 1,
        n_gpu_layers=ov.n_gpu_layers,
        n_cpu_moe=ov.n_cpu_moe,
        parallel=ov.parallel if ov.parallel is not None else getattr(rt, "parallel", None),
        speculative=ov.speculative or getattr(rt, "speculative", None),
        draft=ov.draft or getattr(rt, "draft", None),
        device=ov.device,
    )


def _fit(job: PlanJob, policy: PlacementPolicy, kv_asked: str | None) -> Fit:
    """The placement at the KV cache type chosen: the context shrunk to fit where it may be, then
    the runtime's slots."""
    layers, moe = policy.gpu_layers(job), policy.cpu_moe(job)
    choice = job.choice

    def place_at(kv: str) -> tuple[Placement, Slots]:
        single = fit_context(
            lambda ctx: place(job.shape, job.weights, job.budget, ctx, n_gpu_layers=layers, kv_type=kv, n_cpu_moe=moe),
            choice.n_ctx,
            choice.adjustable,
        )
        return policy.slots(job, single, kv)

    wants = policy.wants_quant_kv(job)
    kv_type, placement, slots, kv_why = choose_kv(place_at, kv_asked, wants, choice.n_ctx, job.shape.n_layer or 0)
    return Fit(kv_type, placement, slots, kv_why)


def _assemble(runtime: str, job: PlanJob, fit: Fit, tuned: Tuning, reasons: list[str]) -> Plan:
    """The plan from the fit and the policy's part of it, with every reason in order."""
    placement, budget, shape, choice = tuned.placement, job.budget, job.shape, job.choice
    reasons = [*reasons, *_device_reasons(placement, budget, job.cpu_why, shape, job.threads), *tuned.reasons]
    reasons += choice.reasons
    if placement.n_ctx < choice.n_ctx:
        reasons.append(f"context reduced from {choice.n_ctx:,} to {placement.n_ctx:,} to fit in memory")
    if not shape.knows_kv:
        reasons.append("the metadata lacks layer and head counts: the KV cache is not counted")
    reasons += fit.slots.reasons
    verdict = verdict_for(placement.ratio)
    reasons += _verdict_reasons(placement, budget, verdict, shape)
    reasons += tuned.closing
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
        **tuned.options,
    }
    return Plan(
        runtime=runtime,
        device=budget.backend if placement.n_gpu_layers else "cpu",
        n_gpu_layers=placement.n_gpu_layers,
        n_ctx=placement.n_ctx,
        n_threads=job.threads,
        n_batch=min(N_UBATCH, placement.n_ctx),
        kv_type=fit.kv_type,
        memory=MemoryEstimate(
            weights=placement.weights,
            kv_cache=placement.kv,
            overhead=placement.overhead,
            prompt_cache=tuned.prompt_cache,
        ),
        verdict=verdict,
        reasons=tuple(reasons),
        options=options,
    )


def _default_runtime_settings() -> RuntimeSettings:
    """The runtime settings' defaults, for a plan made without settings (``model_validate``: the
    type checker cannot see pydantic's positional ``Field`` defaults in ``RuntimeSettings()``)."""
    from localrun.settings import RuntimeSettings

    return RuntimeSettings.model_validate({})


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
