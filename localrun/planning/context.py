"""How much context a model is loaded with, and why: the part of the plan that the user may set.

Precedence, first wins: ``--ctx`` (``run``, ``serve``, ``launch``, ``plan``) or a request that
asked for more (Ollama's ``options.num_ctx``), then ``[models."NAME"] ctx`` (``[models."*"]`` for
every model) in config.toml, then ``runtime.ctx`` (``LOCALRUN_RUNTIME__CTX`` or ``[runtime] ctx``),
then the default.

The default follows Ollama's rule (server/routes.go, docs/context-length.mdx): the memory a
model can run in sets a tier of 4k, 32k or 256k tokens, and the model gets its trained context
up to that tier. Ollama's tiers are by total VRAM (>= 47 GiB: 256k, >= 23 GiB: 32k, else 4k,
the thresholds a little under 48/24 GiB for what drivers keep back). On a GPU localrun uses the
same thresholds on the GPU memory it may fill. On the CPU the memory is RAM, which also holds
the system and every other program, so the top tier needs twice Ollama's 47 GiB; the 32k tier
keeps Ollama's 23 GiB (a 24 GB machine reports about 23.5 GiB). Then, as Ollama steps an
automatic context down a tier when it does not fit, the default drops tier by tier until the
whole plan (weights, KV cache of every slot, compute) fits comfortably (within TIGHT_RATIO of
the available memory); below 4k the largest multiple of 256 tokens that fits is taken.
A context the user set is kept as asked, even when it does not fit (the verdict says so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localrun.errors import ConfigError
from localrun.planning.hardware import HardwareProfile, fmt_bytes
from localrun.planning.placement import TIGHT_RATIO, Budget, ModelShape, Placement

log = logging.getLogger(__name__)

GIB = 1024**3
TIERS = (4096, 32_768, 262_144)
#: (memory at least, tier): GPUs as Ollama; RAM with the top tier at twice Ollama's threshold.
GPU_TIERS = ((47 * GIB, 262_144), (23 * GIB, 32_768))
RAM_TIERS = ((94 * GIB, 262_144), (23 * GIB, 32_768))
MIN_CONTEXT = 512  # below this a chat model is of no use: the verdict becomes wont-fit instead


@dataclass(frozen=True)
class ContextChoice:
    """The context to start from, the words for where it came from, and whether the planner may shrink it."""

    n_ctx: int
    reasons: tuple[str, ...]
    adjustable: bool
    source: str  # "--ctx", "options.num_ctx", '[models."NAME"] ctx', "runtime.ctx", "default"


def tier_for(budget: Budget, hw: HardwareProfile) -> tuple[int, str]:
    """The default tier for this budget, and the memory figure that chose it, in words."""
    if budget.backend != "cpu" and budget.gpu:
        memory = budget.gpu + budget.gpu_margin
        table, what = GPU_TIERS, f"{fmt_bytes(memory)} of {budget.label} memory"
    else:
        memory = hw.ram_total or budget.host
        table, what = RAM_TIERS, f"{fmt_bytes(memory)} of RAM"
    tier = next((t for at_least, t in table if memory >= at_least), TIERS[0])
    return tier, what


def user_context(record_name: str, settings: Any, asked: int | None, asked_by: str | None) -> tuple[int | None, str]:
    """The context the user set, first of: the override, ``[models."NAME"]``/``[models."*"]`` ctx, runtime.ctx."""
    if asked is not None:
        return asked, asked_by or "--ctx"
    models = getattr(settings, "models", None) or {}
    for key in (record_name, "*"):
        entry = models.get(key)
        if entry is not None and getattr(entry, "ctx", None) is not None:
            return entry.ctx, f'[models."{key}"] ctx in config.toml'
    rt = getattr(settings, "runtime", None)
    if rt is not None and getattr(rt, "ctx", None) is not None:
        return rt.ctx, "runtime.ctx in the settings"
    return None, "default"


def initial_context(
    record_name: str,
    shape: ModelShape,
    settings: Any,
    rt: Any,
    budget: Budget,
    hw: HardwareProfile,
    asked: int | None = None,
    asked_by: str | None = None,
) -> ContextChoice:
    """Where to start: what the user set (kept), else the trained context within the memory tier."""
    trained = shape.n_ctx_train
    n, source = user_context(record_name, settings, asked, asked_by)
    if n is not None:
        if n < 1:
            raise ConfigError(f"context length must be positive, not {n}", param="n_ctx")
        if trained and n > trained:
            why = f"context {n:,} asked for by {source}, but the model was trained on {trained:,}: using {trained:,}"
            return ContextChoice(trained, (why,), False, source)
        return ContextChoice(n, (f"context {n:,} set by {source}",), False, source)
    tier, what = tier_for(budget, hw)
    cap, by = tier, f"the default for {what} ({tier // 1024}k tier)"
    for limit, name in ((rt.max_context_default, "runtime.max_context_default"), (rt.context_length, None)):
        if limit is not None and limit < cap:
            cap, by = limit, name or "runtime.context_length in the settings"
    fix = '; --ctx, runtime.ctx or [models."NAME"] ctx to change'
    if not trained:
        return ContextChoice(
            cap, (f"the model does not state its trained context: using {cap:,}, {by}{fix}",), True, source
        )
    if trained > cap:
        return ContextChoice(cap, (f"context {cap:,} of the trained {trained:,}: capped by {by}{fix}",), True, source)
    return ContextChoice(
        trained, (f"context {trained:,}: the model's trained context, within {by}{fix}",), True, source
    )


def grown_context(asked: int, trained: int | None) -> int:
    """The context a reload for ``asked`` tokens loads (localrun/reload.py): the next power of two
    from 4,096 up, capped at ``trained``, so a client that asks a little more each time reloads rarely."""
    target = TIERS[0]
    while target < asked:
        target *= 2
    return min(target, trained) if trained else target


def fit_context(at: Callable[[int], Placement], n_ctx: int, adjustable: bool) -> Placement:
    """Keep a context the user set; shrink a default one until it fits comfortably.

    A default steps down the tiers (256k, 32k, 4k) while the plan is above TIGHT_RATIO, then
    takes the largest multiple of 256 tokens (not below MIN_CONTEXT) that fits comfortably,
    else the largest that fits tightly, else MIN_CONTEXT."""
    first = at(n_ctx)
    if not adjustable or first.ratio <= TIGHT_RATIO or n_ctx <= MIN_CONTEXT:
        return first
    for tier in sorted((t for t in TIERS if t < n_ctx), reverse=True):
        candidate = at(tier)
        if candidate.ratio <= TIGHT_RATIO:
            return candidate
    top = min(n_ctx, TIERS[0])
    for limit in (TIGHT_RATIO, 1.0):  # memory grows with the context, so a binary search finds the edge
        lo, hi, best = MIN_CONTEXT // 256, max(MIN_CONTEXT, top - 1) // 256, None
        if limit == 1.0 and top == n_ctx and first.ratio <= 1.0:
            return first  # fits as it is (tightly): keep it rather than shrink
        while lo <= hi:
            mid = (lo + hi) // 2
            candidate = at(mid * 256)
            if candidate.ratio <= limit:
                best, lo = candidate, mid + 1
            else:
                hi = mid - 1
        if best is not None:
            return best
    return at(MIN_CONTEXT)
