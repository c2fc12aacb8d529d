"""A request that asks for more context than a model is loaded with (Ollama's ``options.num_ctx``).

Ollama reloads the model with the larger context when memory allows. localrun does the same,
with three rules that make it safe to do while other clients are being served:

- **Only grow, by tiers.** The new context is the asked one rounded up to a power of two (at
  least 4,096), capped at the model's trained context. aider asks for ``8192 + 1.25 × prompt``
  on every request; rounding up means one reload per doubling, not one per request, and a
  request asking for less than what is loaded never shrinks it.
- **One reload, never in the middle of someone else's request.** The manager's table
  (``Residency.replace``, localrun/residency.py) holds the model's load lock, so new requests
  for the model queue behind it; the old model is marked retired so nothing more is admitted to
  it, and the swap waits for its in-flight requests to finish before closing it.
- **When memory does not allow it, clamp.** The largest context (a multiple of 256 above the
  loaded one) whose plan still fits is taken; if none is larger, the model stays as it is. The
  caller gets the reason in words (a header and a log line), and the request then meets the
  ordinary overflow error if its prompt really does not fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localrun.planning.context import grown_context
from localrun.planning.placement import ModelShape

if TYPE_CHECKING:
    from localrun.activity import MediaCheck
    from localrun.manager import ModelManager
    from localrun.residency import LoadedModel
    from localrun.types import Media, ModelRecord, Plan


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


def ensure_context(
    manager: ModelManager,
    name: str,
    asked: int,
    source: str,
    *,
    media: tuple[Media, ...] = (),
    check: MediaCheck | None = None,
) -> tuple[LoadedModel, str | None]:
    """The model loaded with at least ``asked`` tokens of context if memory allows; (model, why not) otherwise.

    A model not loaded yet is loaded once, with the larger context straight away, unless the
    request's ``media`` are refused first (see :meth:`ModelManager.load`)."""
    remote = manager.remote_model(name)
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

        return manager.load(name, plan_with=planned, media=media, check=check), (notes[0] if notes else None)
    lm = manager.load(name)
    if lm.plan.n_ctx >= asked:
        return lm, None
    plan, note = _grown_plan(manager, lm.record, lm.plan, asked, source)
    if plan is None:
        return lm, note
    return manager.residency.replace(lm, plan, manager.start_handle), note
