"""What a runtime's placement policy is: the hooks the planner, the budget, ``plan``'s words, the
manager and the activity log ask, and the inputs and outputs those hooks pass around.

The planner does the work every runtime shares (which runtime, how much memory, which context,
how many layers fit, the verdict) and asks the runtime's policy at each point where runtimes
differ. A runtime with nothing special uses :class:`DefaultPolicy`; the others override only the
hooks they need, so the differences between runtimes are read in one module per runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from localrun.planning.context import ContextChoice
from localrun.planning.hardware import HardwareProfile
from localrun.planning.placement import Budget, ModelShape, Placement
from localrun.runtimes.base import RuntimeStatus
from localrun.types import ModelRecord, Plan


@dataclass(frozen=True)
class PlanJob:
    """One planning's inputs, as the planner settled them before it asks the runtime's policy.

    The ``…`` asked-for fields are the user's (an override, else the runtime settings); ``None``
    leaves the choice to the planner and the policy."""

    record: ModelRecord
    hw: HardwareProfile
    status: RuntimeStatus
    settings: Any  # localrun.settings.Settings, or None when the caller planned without them
    budget: Budget
    cpu_why: str | None  # why the plan runs on the CPU, when the budget has no GPU
    shape: ModelShape
    weights: int
    choice: ContextChoice
    threads: int
    n_gpu_layers: int | None  # -1: all
    n_cpu_moe: int | None  # MoE: the experts of the first N layers in RAM (-1: all)
    parallel: int | None  # requests decoded at once
    speculative: str | None  # speculative decoding mode
    draft: str | None  # the draft model: a store name or a .gguf path ("none": no draft)
    device: str | None  # the device asked for ("cpu", "cuda"…)


@dataclass(frozen=True)
class Slots:
    """How many requests a runtime decodes at once, each with the plan's whole context, and why."""

    n: int = 1
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fit:
    """The placement the planner found: KV cache type, where the bytes go, the slots and the words."""

    kv_type: str
    placement: Placement
    slots: Slots
    kv_why: str | None  # why the KV cache is quantised, when the planner chose it


@dataclass(frozen=True)
class Tuning:
    """What a runtime's policy adds to a fit: its placement (a draft model beside it, say), the
    reasons after the device line and after the verdict, its own plan options, and the host RAM
    its prompt cache may fill beyond the fit."""

    placement: Placement
    reasons: tuple[str, ...] = ()
    closing: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    prompt_cache: int = 0


class PlacementPolicy(Protocol):
    """A runtime's placement rules: one object per runtime, kept in ``policies.POLICIES``."""

    @property
    def hints_context(self) -> bool:
        """Whether a "prompt is too long" error gets localrun's hint (``--ctx N``…): not where
        another server sets the context."""
        ...

    @property
    def takes_cache_options(self) -> bool:
        """Whether the runtime reads the prompt cache's settings (RAM and disk tiers) from its plan."""
        ...

    def backend(self, status: RuntimeStatus, hw: HardwareProfile) -> str:
        """The GPU backend this runtime would use here ("cuda", "metal"…), or "cpu"."""
        ...

    def gpu_layers(self, job: PlanJob) -> int | None:
        """The GPU layers to place (-1: all; ``None``: as many as fit)."""
        ...

    def cpu_moe(self, job: PlanJob) -> int | None:
        """The layers whose MoE experts stay in RAM (``None``: the runtime does not place experts)."""
        ...

    def wants_quant_kv(self, job: PlanJob) -> bool:
        """Whether a quantised KV cache may be chosen to make the asked-for context or parallelism fit."""
        ...

    def slots(self, job: PlanJob, single: Placement, kv_type: str) -> tuple[Placement, Slots]:
        """The placement for several requests at once, from the one for a single request."""
        ...

    def tune(self, job: PlanJob, fit: Fit) -> Tuning:
        """The runtime's own part of the plan, from the planner's fit.

        Raises:
            ConfigError: an option of the runtime's out of range.
        """
        ...

    def finish(self, plan: Plan, job: PlanJob) -> Plan:
        """The assembled plan, with what only this runtime adds or sizes its own way."""
        ...

    def plan_lines(self, plan: Plan) -> list[str]:
        """The lines ``localrun plan`` prints for this runtime's own options, after the build line."""
        ...


class DefaultPolicy:
    """A runtime with nothing special (the fake): CPU placement as the memory model gives it,
    one request at a time, no options of its own."""

    hints_context: bool = True
    takes_cache_options: bool = False

    def backend(self, status: RuntimeStatus, hw: HardwareProfile) -> str:
        return "cpu"

    def gpu_layers(self, job: PlanJob) -> int | None:
        return job.n_gpu_layers

    def cpu_moe(self, job: PlanJob) -> int | None:
        return None

    def wants_quant_kv(self, job: PlanJob) -> bool:
        return False

    def slots(self, job: PlanJob, single: Placement, kv_type: str) -> tuple[Placement, Slots]:
        return single, Slots()

    def tune(self, job: PlanJob, fit: Fit) -> Tuning:
        return Tuning(fit.placement)

    def finish(self, plan: Plan, job: PlanJob) -> Plan:
        return plan

    def plan_lines(self, plan: Plan) -> list[str]:
        return []
