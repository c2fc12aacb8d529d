"""MLX's and MLC's placement rules: each places the whole model on its device (no partial
offload), so a plan on a GPU backend puts every layer there."""

from __future__ import annotations

from localrun.planning.budget import hw_backend
from localrun.planning.hardware import HardwareProfile
from localrun.planning.policies.base import DefaultPolicy, PlanJob
from localrun.runtimes.base import RuntimeStatus


class WholeDevicePolicy(DefaultPolicy):
    """A runtime that runs the whole model where its backend is, or the whole model on the CPU."""

    def gpu_layers(self, job: PlanJob) -> int | None:
        return -1 if job.budget.backend != "cpu" else job.n_gpu_layers


class MlxPolicy(WholeDevicePolicy):
    """MLX: Metal on a Mac, CUDA where its CUDA build probed a GPU, else the CPU."""

    def backend(self, status: RuntimeStatus, hw: HardwareProfile) -> str:
        return "metal" if "metal" in status.devices else "cuda" if "cuda" in status.devices else "cpu"


class MlcPolicy(WholeDevicePolicy):
    """MLC LLM ships its own GPU libraries: the machine's GPU decides the backend."""

    def backend(self, status: RuntimeStatus, hw: HardwareProfile) -> str:
        return hw_backend(hw)
