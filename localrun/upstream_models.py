"""Upstream models as the rest of localrun sees them: records, loaded-model entries, listings.

An upstream model gets a :class:`~localrun.types.ModelRecord` (format ``remote``, source
``upstream``, no files) so every listing and ``/api/show`` can describe it like a local
one, and a :class:`~localrun.manager.LoadedModel` around an in-process handle, so requests
take the same admission queue and chunk stream. It is never evicted or reaped: there is
nothing here to free.

Names (llama-swap's rule, with the local store first): a model id is listed under its own
name when only upstreams offer it; when a local model has the same name, the local one
keeps the bare name and each upstream's copy is listed as ``UPSTREAM/MODEL`` — both
visible, neither hidden. ``UPSTREAM/MODEL`` always reaches that upstream alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from localrun.types import Format, ModelRecord, Plan, Source
from localrun.upstream_pool import Route, UpstreamPool

log = logging.getLogger(__name__)


def remote_record(pool: UpstreamPool, route: Route) -> ModelRecord:
    entry: dict = {}
    for name in route.upstreams:
        st = pool.get(name)
        if st is not None and route.model in st.models:
            entry = st.models[route.model]
            break
    meta: dict = {"upstreams": list(route.upstreams), "upstream_model": route.model}
    ctx = entry.get("max_model_len") or entry.get("context_length")
    if isinstance(ctx, int) and ctx > 0:
        meta["context_length"] = ctx
    urls = ", ".join(pool.get(n).config.url for n in route.upstreams if pool.get(n) is not None)
    return ModelRecord(name=route.name, format=Format.REMOTE, path=urls, source=Source.UPSTREAM,
                       repo=entry.get("root") if isinstance(entry.get("root"), str) else None, metadata=meta,
                       added_at=float(entry.get("created") or 0) if isinstance(entry.get("created"), (int, float)) else 0.0)


def remote_loaded_model(pool: UpstreamPool, route: Route, settings):
    """A LoadedModel for ``route``: pinned, with room for every upstream's slots plus the queue."""
    from localrun.manager import LoadedModel
    from localrun.upstream_session import UpstreamSession
    from localrun.worker.host import InProcessHandle

    record = remote_record(pool, route)
    plan = Plan(runtime="upstream", device="upstream " + ",".join(route.upstreams), n_ctx=record.metadata.get("context_length") or 0,
                reasons=(f"served by upstream {', '.join(route.upstreams)}",))
    session = UpstreamSession(pool, route)
    slots = sum(pool.get(n).config.max_concurrency for n in route.upstreams if pool.get(n) is not None)
    lm = LoadedModel(route.name, record, plan, InProcessHandle(record, plan, session), keep_alive_s=-1.0, pinned=True,
                     queue_limit=slots + settings.server.queue_size)
    return lm


@dataclass(frozen=True)
class Listed:
    """One upstream model as a listing shows it."""

    name: str
    route: Route
    record: ModelRecord
    health: str  # "up" when any of its upstreams is up, else the best state among them


def source_label(record: ModelRecord) -> str:
    """``upstream NAME (health)`` for an upstream model, the plain source otherwise (listings, the TUI)."""
    if record.source is not Source.UPSTREAM:
        return record.source.value
    names = ",".join(record.metadata.get("upstreams", ()))
    health = record.metadata.get("upstream_health")
    return f"upstream {names}" + (f" ({health})" if health else "")


def _health(pool: UpstreamPool, names: Iterable[str]) -> str:
    order = ("up", "cooldown", "unknown", "down")
    states = [pool.get(n).status()["health"] for n in names if pool.get(n) is not None]
    return min(states, key=order.index) if states else "unknown"


def listed_models(pool: UpstreamPool | None, local_names: Iterable[str]) -> list[Listed]:
    """Every upstream model under the name that reaches it, given the local store's names."""
    if pool is None:
        return []
    local = set(local_names)
    out: list[Listed] = []
    for model, servers in sorted(pool.catalog().items()):
        if model in local:
            log.debug("%s is a local model and also served by %s: listed as NAME/%s", model, ", ".join(servers), model)
            routes = [Route(f"{s}/{model}", model, (s,), True) for s in servers]
        else:
            routes = [Route(model, model, servers, False)]
        for route in routes:
            health = _health(pool, route.upstreams)
            record = remote_record(pool, route)
            record.metadata["upstream_health"] = health
            out.append(Listed(route.name, route, record, health))
    return out
