"""vLLM's placement rules: tensor parallelism, context and memory share on the CUDA GPUs there are.

vLLM places a whole model on its GPUs itself (no partial offload, no CPU spill), so the
llama.cpp memory model of :mod:`localrun.planning.placement` does not apply: the planner's
estimate is kept for the weights and the KV cache per token, and this module finds how many
GPUs hold them. It is planning knowledge, so it lives here rather than in the runtime; the
runtime only turns the plan's options into vLLM's command line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from localrun.planning.hardware import HardwareProfile
from localrun.planning.policies.base import DefaultPolicy, PlanJob
from localrun.runtimes.base import RuntimeStatus
from localrun.types import Plan

#: The share of each GPU a vLLM plan asks for (``--gpu-memory-utilization``): vLLM's own default.
GPU_MEMORY_UTILISATION = 0.90


def vllm_placement(weights: int, kv_per_token: int, n_ctx: int, gpu_vram: Sequence[int]) -> dict[str, Any]:
    """Tensor parallel size, context and memory share for vLLM on these GPUs (bytes of VRAM each).

    The smallest power-of-two number of GPUs whose share of the weights plus the KV cache
    of one full context fits in ``GPU_MEMORY_UTILISATION`` of each; the context is halved
    (down to 512) when even all GPUs cannot hold it. ``fits`` is False when nothing works.
    """
    gpus = sorted(gpu_vram, reverse=True)
    if not gpus:
        return {"fits": False, "why": "no CUDA GPU"}
    ctx = n_ctx
    while ctx >= 512:
        tp = 1
        while tp <= len(gpus):
            per_gpu = (weights + kv_per_token * ctx) / tp * 1.1  # +10 %: activations, CUDA graphs
            budget = gpus[tp - 1] * GPU_MEMORY_UTILISATION
            if per_gpu <= budget:
                return {
                    "fits": True,
                    "tensor_parallel_size": tp,
                    "max_model_len": ctx,
                    "gpu_memory_utilization": GPU_MEMORY_UTILISATION,
                    "per_gpu_bytes": int(per_gpu),
                }
            tp *= 2
        ctx //= 2
    return {"fits": False, "why": f"{weights / 2**30:.1f} GiB of weights do not fit {len(gpus)} GPU(s)"}


def plan_for_vllm(plan: Plan, hw: HardwareProfile, status: RuntimeStatus, *, asked_device: str | None = None) -> Plan:
    """The planner's plan made vLLM's: CUDA placement (tensor parallel size, context, memory share).

    On a machine without a CUDA GPU, or where the probe admitted a CPU build (its only device
    is ``cpu``: ``LOCALRUN_VLLM_DEVICE=cpu``), or with ``--device cpu``, it runs on the CPU
    with the planner's context.
    """
    mem = plan.memory
    weights, kv = (mem.weights, mem.kv_cache) if mem else (0, 0)
    per_token = kv // plan.n_ctx if plan.n_ctx else 0
    cuda = [g for g in getattr(hw, "gpus", ()) or () if str(getattr(g, "vendor", "")).lower() == "nvidia"]
    options = {**plan.options, "tensor_parallel_size": 1, "max_model_len": plan.n_ctx}
    if not cuda or status.devices == ("cpu",) or asked_device == "cpu":
        why = "vLLM on the CPU: a CPU build, for tests; it is a GPU engine"
        return dataclasses.replace(plan, device="cpu", n_gpu_layers=0, options=options, reasons=(*plan.reasons, why))
    fit = vllm_placement(weights, per_token, plan.n_ctx, [int(g.vram_free or g.vram_total) for g in cuda])
    if not fit["fits"]:
        return dataclasses.replace(
            plan, device="cuda", verdict="wont-fit", options=options, reasons=(*plan.reasons, f"vLLM: {fit['why']}")
        )
    options.update(
        tensor_parallel_size=fit["tensor_parallel_size"],
        max_model_len=fit["max_model_len"],
        gpu_memory_utilization=fit["gpu_memory_utilization"],
    )
    why = (
        f"vLLM on {fit['tensor_parallel_size']} CUDA GPU(s): {fit['per_gpu_bytes'] / 2**30:.1f} GiB each "
        f"within {fit['gpu_memory_utilization']:.0%} of its memory"
    )
    return dataclasses.replace(
        plan,
        device="cuda",
        n_gpu_layers=-1,
        n_ctx=fit["max_model_len"],
        verdict="fits",
        options=options,
        reasons=(*plan.reasons, why),
    )


class VllmPolicy(DefaultPolicy):
    """vLLM sizes the plan its own way once the planner has estimated the weights and KV cache."""

    def finish(self, plan: Plan, job: PlanJob) -> Plan:
        return plan_for_vllm(plan, job.hw, job.status, asked_device=job.device)

    def plan_lines(self, plan: Plan) -> list[str]:
        o = plan.options
        share = f", GPU memory utilisation {o['gpu_memory_utilization']:.2f}" if "gpu_memory_utilization" in o else ""
        return [
            f"vllm      tensor parallel {o.get('tensor_parallel_size', 1)}, max model length "
            f"{o.get('max_model_len', plan.n_ctx):,}{share}"
        ]
