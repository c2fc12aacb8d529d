"""Ollama's placement rules: it places the model itself, so localrun's numbers are an estimate
handed to it as ``num_ctx``, ``num_gpu`` and ``num_thread``, and its server schedules requests."""

from __future__ import annotations

from localrun.planning.budget import hw_backend
from localrun.planning.hardware import HardwareProfile
from localrun.planning.policies.base import DefaultPolicy, Fit, PlanJob, Tuning
from localrun.runtimes.base import RuntimeStatus


class OllamaPolicy(DefaultPolicy):
    """Ollama ships its own GPU libraries: the machine's GPU decides the backend, not a build."""

    def backend(self, status: RuntimeStatus, hw: HardwareProfile) -> str:
        return hw_backend(hw)

    def tune(self, job: PlanJob, fit: Fit) -> Tuning:
        placed = fit.placement
        return Tuning(
            placed,
            closing=("Ollama makes the final placement itself; these numbers are localrun's estimate",),
            options={"num_ctx": placed.n_ctx, "num_gpu": placed.n_gpu_layers, "num_thread": job.threads},
        )
