"""llama.cpp's placement rules: parallel slots, MoE experts in RAM, the split over several GPUs,
flash attention, the prompt cache's RAM tier, speculative decoding with its draft model, and
the projector's encoder.

What goes to llama.cpp, as plan options its session reads at load time:

- ``n_slots`` and ``slot_ctx``: the requests decoded at once, each with the whole context;
- ``tensor_overrides``: ``[pattern, buffer type]`` pairs (llama.cpp's ``-ot``), e.g. the routed
  experts of the first N layers to ``"CPU"`` (``--n-cpu-moe N``, or ``--cpu-moe`` for all);
- ``tensor_split`` (one share per GPU, by free memory) and ``main_gpu`` (the largest) when
  there are several GPUs;
- ``n_cpu_moe``, for the plan's words and ``--json``;
- ``speculative``, ``draft``, ``kv_ram_bytes`` and ``checkpoints``, and ``media`` for a projector.
"""

from __future__ import annotations

import os
from typing import Any

from localrun.errors import ConfigError
from localrun.planning.budget import hw_backend
from localrun.planning.hardware import HardwareProfile, fmt_bytes
from localrun.planning.media import with_media
from localrun.planning.placement import (
    FLASH_BACKENDS,
    TIGHT_RATIO,
    Budget,
    ModelShape,
    Placement,
    place,
    tensor_overrides,
)
from localrun.planning.policies.base import DefaultPolicy, Fit, PlanJob, Slots, Tuning
from localrun.planning.speculation import draft_plan, speculation_plan
from localrun.runtimes.base import RuntimeStatus
from localrun.settings import default_kv_ram_bytes
from localrun.types import Plan

#: Parallel llama.cpp slots the planner tries, most first, when the settings do not say.
AUTO_SLOTS = (4, 3, 2)


class LlamaCppPolicy(DefaultPolicy):
    """llama.cpp: the planner's memory model is llama.cpp's, so every rule of it applies here."""

    takes_cache_options = True

    def backend(self, status: RuntimeStatus, hw: HardwareProfile) -> str:
        """The backend the installed build reports (its probe), Metal for a "gpu" build on a Mac."""
        backend = status.details.get("backend") or next((d for d in status.devices if d != "cpu"), "cpu")
        return "metal" if backend == "gpu" and hw.apple else str(backend)

    def cpu_moe(self, job: PlanJob) -> int | None:
        return job.n_cpu_moe

    def wants_quant_kv(self, job: PlanJob) -> bool:
        return not job.choice.adjustable or job.parallel is not None

    def slots(self, job: PlanJob, single: Placement, kv_type: str) -> tuple[Placement, Slots]:
        return choose_slots(job.shape, job.weights, job.budget, single, job.parallel, kv_type)

    def tune(self, job: PlanJob, fit: Fit) -> Tuning:
        """Speculation and its draft (beside the model), MoE, GPU split, flash and the prompt cache."""
        slots, kv_type, budget = fit.slots.n, fit.kv_type, job.budget
        mode, speculate_why = speculation_plan(job.speculative, slots)
        placement = fit.placement
        draft = draft_plan(job.record, mode, job.draft, job.settings, n_ctx=slots * placement.n_ctx, kv_type=kv_type)
        if draft is not None:
            placement = draft.beside(placement, budget)
        gpu_opts: dict[str, Any] = {}
        reasons: list[str] = []
        for opts, why in (moe_options(job.shape, budget, placement, job.n_cpu_moe), split_options(budget, placement)):
            gpu_opts.update(opts)
            reasons += why
        reasons += [w for w in (flash_reason(budget, placement, kv_type), fit.kv_why) if w]
        cache_ram, cache_why = prompt_cache_ram(job.settings, budget, placement)
        reasons.append(cache_why)
        options: dict[str, Any] = {"n_slots": slots, "slot_ctx": placement.n_ctx, **gpu_opts}
        if job.status.details.get("backend"):  # the build next to what the machine could use, for `plan`'s words
            options.update(llama_backend=job.status.details["backend"], machine_backend=hw_backend(job.hw))
        options["speculative"] = mode
        options["kv_ram_bytes"] = cache_ram
        if job.settings is not None:  # state checkpoints per sequence where memory cannot be cut (checkpoints.py)
            options["checkpoints"] = job.settings.cache.checkpoints
            # templates without tool syntax: a call or a reply (localrun/chat/tool_reply.py), or the tags
            options["tool_fallback"] = getattr(job.settings.runtime, "tool_fallback", "tagged")
        closing = [speculate_why]
        if draft is not None:
            options["draft"] = draft.path
            closing.append(draft.why)
        return Tuning(placement, tuple(reasons), tuple(closing), options, cache_ram)

    def finish(self, plan: Plan, job: PlanJob) -> Plan:
        return with_media(plan, job.record)  # the projector's encoder, per image

    def plan_lines(self, plan: Plan) -> list[str]:
        lines = []
        if "n_slots" in plan.options:
            n = plan.options["n_slots"]
            lines.append(
                f"parallel  {n} requests at once, each with the whole context"
                if n > 1
                else "parallel  one request at a time"
            )
        if "speculative" in plan.options:
            draft = plan.options.get("draft")
            by = f"draft model {os.path.basename(draft)}" if draft else "text seen before"
            mode = plan.options["speculative"]
            lines.append(f"speculate {SPECULATE_WORDS.get(mode, mode).format(by=by)}")
        return lines


#: The plan's "speculate" line in words (``{by}``: the draft model, or the text seen before).
SPECULATE_WORDS = {
    "auto": "guesses ahead from {by} while that is faster (auto)",
    "ngram": "guesses ahead from text seen before, every step (ngram)",
    "draft": "guesses ahead with the {by}, every step (draft)",
    "off": "off",
}


def choose_slots(
    shape: ModelShape, weights: int, budget: Budget, single: Placement, asked: int | None, kv_type: str
) -> tuple[Placement, Slots]:
    """How many requests llama.cpp decodes at once, each with the plan's whole context.

    Asked for: that many, whatever the verdict says of it. Otherwise the most of
    AUTO_SLOTS whose extra KV cache keeps the plan comfortably within memory ("fits"),
    with the GPU layers of the single-request plan (offload speeds every request; slots
    only help when several arrive together); one when the model is tight already.

    Raises:
        ConfigError: fewer than one slot asked for.
    """

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
        why = f"parallel {asked}, as asked: that many requests at once, each with the whole context"
        return at(asked), Slots(asked, (why,))
    for n in AUTO_SLOTS:
        candidate = at(n)
        if candidate.ratio <= TIGHT_RATIO:
            extra = candidate.kv - single.kv
            why = (
                f"{n} requests run at once, each with the whole context "
                f"(+{fmt_bytes(extra)} of KV cache; --parallel or runtime.parallel to change)"
            )
            return candidate, Slots(n, (why,))
    return single, Slots(1, ("one request at a time: more parallel slots would not fit comfortably",))


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
    """The line on flash attention where the plan runs layers on a backend that has its kernels."""
    if not placement.n_gpu_layers or budget.backend not in FLASH_BACKENDS:
        return None
    if kv_type not in ("f16", "f32", "bf16"):
        return f"flash attention on: the {kv_type} KV cache needs it, and {budget.label} has it"
    return (
        f"flash attention: llama.cpp's auto, on where {budget.label} has the kernels "
        "(so no attention-score buffer is counted)"
    )


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
