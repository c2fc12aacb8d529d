"""A plan in words, as ``localrun plan`` and the TUI's Library print it: one line per choice the
planner made (runtime, layers, context, slots, speculation, memory, placement) and the reasons
after them. Kept apart from :mod:`.planner`, which decides; this only reads the Plan."""

from __future__ import annotations

from localrun.planning.hardware import fmt_bytes
from localrun.planning.media import media_lines
from localrun.planning.placement import ModelShape
from localrun.planning.planner import DEVICE_LABELS
from localrun.planning.policies import policy_for
from localrun.types import ModelRecord, Plan


def render_plan(plan: Plan, record: ModelRecord) -> list[str]:
    """Plain lines for ``localrun plan``: what runs where, how much memory, the verdict and why."""
    meta = record.metadata
    facts = [record.format.value.upper(), meta.get("quant"), fmt_bytes(record.size) if record.size else None]
    placed = plan.options.get("placement", {})
    total = placed.get("layers_total")
    if plan.n_gpu_layers and total:
        layers = f"{min(plan.n_gpu_layers, total)} of {total} on {DEVICE_LABELS.get(plan.device, plan.device)}"
        moe = plan.options.get("n_cpu_moe") or 0
        if moe:
            flag = "--cpu-moe" if moe >= total - 1 else f"--n-cpu-moe {moe}"
            layers += f", experts of {min(moe, total - 1)} layers in RAM ({flag})"
    else:
        layers = "CPU only"
    trained = ModelShape.from_metadata(meta).n_ctx_train
    lines = [
        f"model     {record.name} ({', '.join(f for f in facts if f)})",
        f"runtime   {plan.runtime} on {DEVICE_LABELS.get(plan.device, plan.device)}, {plan.n_threads} threads",
        f"layers    {layers}",
        f"context   {plan.n_ctx:,} tokens"
        + (f" (trained {trained:,})" if trained else "")
        + f", KV cache {plan.kv_type}"
        + (f", set by {plan.options['ctx_source']}" if plan.options.get("ctx_source", "default") != "default" else ""),
    ]
    if plan.options.get("tensor_split"):
        shares = " / ".join(f"{x:.0%}" for x in plan.options["tensor_split"])
        lines.append(f"gpus      layers split {shares} by free memory, main GPU {plan.options.get('main_gpu', 0)}")
    if plan.options.get("llama_backend"):
        from localrun.planning.budget import build_words

        lines.append(
            "build     " + build_words(plan.options["llama_backend"], plan.options.get("machine_backend") or "cpu")
        )
    lines += policy_for(plan.runtime).plan_lines(plan)  # the runtime's own options: slots, speculation…
    if plan.memory:
        m = plan.memory
        lines.append(
            f"memory    weights {fmt_bytes(m.weights)} + KV cache {fmt_bytes(m.kv_cache)} "
            f"+ overhead {fmt_bytes(m.overhead)} = {fmt_bytes(m.total)}"
            + (f"; prompt cache up to {fmt_bytes(m.prompt_cache)} more" if m.prompt_cache else "")
        )
    if placed.get("gpu_bytes"):
        lines.append(
            f"placement GPU {fmt_bytes(placed['gpu_bytes'])} of {fmt_bytes(placed['gpu_budget'])}, "
            f"RAM {fmt_bytes(placed['host_bytes'])} of {fmt_bytes(placed['host_budget'])}"
        )
    elif placed:
        lines.append(f"placement RAM {fmt_bytes(placed['host_bytes'])} of {fmt_bytes(placed['host_budget'])} available")
    lines += media_lines(plan)
    lines.append(f"verdict   {plan.verdict}")
    lines.extend(("why       " if i == 0 else "          ") + f"- {r}" for i, r in enumerate(plan.reasons))
    return lines
