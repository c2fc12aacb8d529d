"""A request that asks for more context than a model is loaded with (Ollama's ``options.num_ctx``).

Ollama reloads the model with the larger context when memory allows. localrun does the same,
with three rules that make it safe to do while other clients are being served:

- **Only grow, by tiers.** The new context is the asked one rounded up to a power of two (at
  least 4,096), capped at the model's trained context. aider asks for ``8192 + 1.25 × prompt``
  on every request; rounding up means one reload per doubling, not one per request, and a
  request asking for less than what is loaded never shrinks it.
- **One reload, never in the middle of someone else's request.** The reload holds the model's
  load lock, so new requests for the model queue behind it; the old model is marked retired so
  nothing more is admitted to it, and the reload waits for its in-flight requests to finish
  before closing it.
- **When memory does not allow it, clamp.** The largest context (a multiple of 256 above the
  loaded one) whose plan still fits is taken; if none is larger, the model stays as it is. The
  caller gets the reason in words (a header and a log line), and the request then meets the
  ordinary overflow error if its prompt really does not fit.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from localrun.planning.context import grown_context
from localrun.planning.placement import ModelShape

if TYPE_CHECKING:
    from localrun.manager import LoadedModel, ModelManager
    from localrun.types import ModelRecord, Plan

log = logging.getLogger("localrun.activity")  # a reload is what a waiting user wants to know of


def _fitting_plan(manager: ModelManager, record: ModelRecord, current: int, target: int, source: str) -> Plan | None:
    """The plan at ``target``, or at the largest multiple of 256 above ``current`` that fits; None if none."""
    plan = manager.plan_for(record, target, source)
    if plan.verdict != "wont-fit":
        return plan
    lo, hi, best = current // 256 + 1, (target - 1) // 256, None
    while lo <= hi:  # memory grows with the context: the edge is found by bisection
        mid = (lo + hi) // 2
        candidate = manager.plan_for(record, mid * 256, source)
        if candidate.verdict != "wont-fit":
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    return best


def _grown_plan(
    manager: ModelManager, record: ModelRecord, current: Plan, asked: int, source: str
) -> tuple[Plan | None, str | None]:
    """The plan with more context to load for ``asked`` (None: keep ``current``), and what to tell the user."""
    trained = ModelShape.from_metadata(record.metadata).n_ctx_train
    target = grown_context(asked, trained)
    if target <= current.n_ctx:
        return None, (
            f"{source} {asked:,} is beyond the {trained:,} tokens {record.name} was trained on: "
            f"kept at {current.n_ctx:,}"
        )
    plan = _fitting_plan(manager, record, current.n_ctx, target, source)
    if plan is None or plan.n_ctx <= current.n_ctx:
        return None, (
            f"{source} {asked:,} does not fit in memory: {record.name} kept at {current.n_ctx:,} tokens "
            f'(start the server with --ctx or set [models."{record.name}"] ctx to load it larger)'
        )
    if plan.n_ctx < asked:
        return plan, f"{source} {asked:,} clamped to {plan.n_ctx:,}, the most that fits in memory"
    return plan, None


def ensure_context(manager: ModelManager, name: str, asked: int, source: str) -> tuple[LoadedModel, str | None]:
    """The model loaded with at least ``asked`` tokens of context if memory allows; (model, why not) otherwise.

    A model not loaded yet is loaded once, with the larger context straight away."""
    remote = manager._remote_model(name)
    if remote is not None:
        note = None if remote.plan.n_ctx >= asked else f"{remote.name} is served by another server, at its context"
        return remote, note
    record = manager.store.resolve(name)
    if not manager.is_loaded(record.name):
        notes: list[str | None] = []

        def planned(r: ModelRecord) -> Plan:
            base = manager.plan_for(r)
            if base.n_ctx >= asked:
                return base
            plan, note = _grown_plan(manager, r, base, asked, source)
            notes.append(note)
            return plan or base

        return manager.load(name, plan_with=planned), (notes[0] if notes else None)
    lm = manager.load(name)
    if lm.plan.n_ctx >= asked:
        return lm, None
    plan, note = _grown_plan(manager, lm.record, lm.plan, asked, source)
    if plan is None:
        return lm, note
    return _reload(manager, lm, plan), note


def _reload(manager: ModelManager, old: LoadedModel, plan: Plan) -> LoadedModel:
    """Replace ``old`` by the same model on ``plan`` once its in-flight requests are done."""
    import dataclasses

    key = old.name
    with manager._lock:
        lock = manager._load_locks.setdefault(key, threading.Lock())
    with lock:  # new requests for this model wait here, behind the reload
        with manager._lock:
            current = manager._models.get(key)
            if current is not None and current is not old and current.plan.n_ctx >= plan.n_ctx:
                return current  # another request grew it meanwhile
            old = current or old
            old.retired = True
            waited = time.monotonic()
            while old.active > 0:
                manager._released.wait(1.0)
            manager._models.pop(key, None)
        log.info(
            "reloading %s with a %d-token context (was %d; waited %.1f s for %s)",
            key,
            plan.n_ctx,
            old.plan.n_ctx,
            time.monotonic() - waited,
            "in-flight requests" if time.monotonic() - waited > 0.05 else "nothing",
        )
        old.handle.close()
        manager._emit({"event": "unloaded", "model": key, "reason": f"reloading with context {plan.n_ctx}"})
        handle = manager._start_handle(old.record, plan)
        now = time.monotonic()
        lm = dataclasses.replace(
            old, plan=plan, handle=handle, loaded_at=time.time(), last_used=now, active=0, retired=False
        )
        with manager._lock:
            manager._models[key] = lm
        manager._emit({"event": "loaded", "model": key})
        return lm
