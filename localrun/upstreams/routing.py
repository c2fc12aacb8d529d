"""Upstream models as the rest of localrun sees them: records, routed entries, listings.

An upstream model gets a :class:`~localrun.types.ModelRecord` (format ``remote``, source
``upstream``, no files) so every listing and ``/api/show`` can describe it like a local
one, and a :class:`RemoteEntry` (record, plan, session, queue room) that the manager wraps
into its own loaded model, so requests take the same admission queue and chunk stream.
It is never evicted or reaped: there is nothing here to free.

Names (llama-swap's rule, with the local store first): a model id is listed under its own
name when only upstreams offer it; when a local model has the same name, the local one
keeps the bare name and each upstream's copy is listed as ``UPSTREAM/MODEL`` — both
visible, neither hidden. ``UPSTREAM/MODEL`` always reaches that upstream alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localrun.types import Format, ModelRecord, Plan, Source
from localrun.upstreams.pool import Route, UpstreamPool
from localrun.upstreams.session import UpstreamSession, route_media

if TYPE_CHECKING:
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

log = logging.getLogger(__name__)


def remote_record(pool: UpstreamPool, route: Route) -> ModelRecord:
    entry: dict[str, Any] = {}
    for name in route.upstreams:
        st = pool.get(name)
        if st is not None and route.model in st.models:
            entry = st.models[route.model]
            break
    meta: dict[str, Any] = {"upstreams": list(route.upstreams), "upstream_model": route.model}
    ctx = entry.get("max_model_len") or entry.get("context_length")
    if isinstance(ctx, int) and ctx > 0:
        meta["context_length"] = ctx
    meta["upstream_media"] = sorted(route_media(pool, route))  # /api/show and /v1/models say it
    urls = ", ".join(st.config.url for n in route.upstreams if (st := pool.get(n)) is not None)
    return ModelRecord(
        name=route.name,
        format=Format.REMOTE,
        path=urls,
        source=Source.UPSTREAM,
        repo=entry.get("root") if isinstance(entry.get("root"), str) else None,
        metadata=meta,
        added_at=float(entry.get("created") or 0) if isinstance(entry.get("created"), (int, float)) else 0.0,
    )


@dataclass(frozen=True)
class RemoteEntry:
    """What a routed upstream name is served by; the manager wraps it into its own LoadedModel.

    Routing stops here (a record, a plan, a session and the queue room), so this package
    never imports the manager or the worker: the arrow points one way.
    """

    name: str
    route: Route
    record: ModelRecord
    plan: Plan
    session: UpstreamSession
    queue_limit: int  # every upstream's slots plus the server's queue


def remote_entry(pool: UpstreamPool, route: Route, settings: Settings) -> RemoteEntry:
    """The entry for ``route``: room for every upstream's slots plus the queue."""
    record = remote_record(pool, route)
    plan = Plan(
        runtime="upstream",
        device="upstream " + ",".join(route.upstreams),
        n_ctx=record.metadata.get("context_length") or 0,
        reasons=(f"served by upstream {', '.join(route.upstreams)}",),
    )
    slots = sum(st.config.max_concurrency for n in route.upstreams if (st := pool.get(n)) is not None)
    return RemoteEntry(
        route.name, route, record, plan, UpstreamSession(pool, route), slots + settings.server.queue_size
    )


@dataclass(frozen=True)
class Listed:
    """One upstream model as a listing shows it."""

    name: str
    route: Route
    record: ModelRecord
    health: str  # "up" when any of its upstreams is up, else the best state among them


def _health(pool: UpstreamPool, names: Iterable[str]) -> str:
    order = ("up", "cooldown", "unknown", "down")
    states = [str(st.status()["health"]) for n in names if (st := pool.get(n)) is not None]
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


#: How long "is this name a local model?" is remembered when routing (a store lookup costs
#: milliseconds; a model imported meanwhile takes its name back within this time).
LOCAL_CHECK_S = 2.0


class RemoteModels:
    """The manager's upstream models: which name routes where, each a cached :class:`RemoteEntry`."""

    def __init__(self, pool: UpstreamPool, store: ModelStore, settings: Settings) -> None:
        self.pool, self.store, self.settings = pool, store, settings
        self._entries: dict[str, RemoteEntry] = {}
        self._local_seen: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def is_local(self, name: str) -> bool:
        from localrun.errors import ModelNotFound

        now = time.monotonic()
        hit = self._local_seen.get(name)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            self.store.resolve(name)
            found = True
        except ModelNotFound:
            found = False
        if len(self._local_seen) > 4096:
            self._local_seen.clear()
        self._local_seen[name] = (now + LOCAL_CHECK_S, found)
        return found

    def get(self, name: str) -> RemoteEntry | None:
        """The entry ``name`` routes to, or None when it is a local name (local wins a bare name)."""
        if self.pool.get(name.partition("/")[0]) is None and self.is_local(name):
            return None  # a local name: never wait on an upstream for it
        route = self.pool.route(name)
        if route is None or (not route.pinned and self.is_local(name)):
            return None
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.route.upstreams != route.upstreams:
                entry = self._entries[name] = remote_entry(self.pool, route, self.settings)
            return entry

    def warm(self, name: str) -> bool:
        """Whether routing ``name`` needs no I/O now: routed before, every upstream's list read."""
        return name in self._entries and self.pool.discovery_done()
