"""ModelManager: the one owner of every loaded model.

The server, the TUI and the CLI all go through it; none of them talks to a runtime. It
loads a model on first use by name (store → planner → worker), bounds each model's queue,
unloads idle models after their keep-alive, caps how many are loaded (evicting the least
recently used idle one, never one with requests in flight), and restarts a worker that
died on the next request.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from localrun.activity import MediaCheck, refuse_media_before_load
from localrun.catalog import CatalogEntry, source_label
from localrun.errors import Cancelled, LocalrunError
from localrun.residency import LoadedModel, Residency
from localrun.settings import Settings
from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest, Media, ModelRecord, Plan
from localrun.worker.host import Spawns

if TYPE_CHECKING:
    from pathlib import Path

    from localrun.activity import OpenStream, RequestTiming
    from localrun.upstreams.pool import UpstreamPool

log = logging.getLogger(__name__)

Planner = Callable[[ModelRecord], Plan]


class ModelManager:
    def __init__(
        self,
        settings: Settings,
        store: Any,
        *,
        planner: Planner | None = None,
        overrides: Any = None,
        events: Callable[[dict[str, Any]], None] | None = None,
        upstreams: Any = None,
    ) -> None:
        self.settings = settings
        self.store = store
        #: The upstream pool (localrun.upstreams.pool), built from settings.upstreams unless one is passed in.
        self.upstreams = upstreams if upstreams is not None else _pool_from(settings)
        self._remote = None
        self._remote_loaded: dict[str, LoadedModel] = {}
        if self.upstreams is not None:
            from localrun.upstreams.routing import RemoteModels

            self._remote = RemoteModels(self.upstreams, store, settings)
        self._planner = planner
        #: The CLI's planner overrides (--ctx, --gpu-layers…) for the default planner; see plan_for.
        self._overrides = overrides
        #: One log file for every worker's output (``launch`` shows it); None: logs/worker-NAME.log each.
        self.worker_log: Path | None = None
        #: The table of loaded models (localrun/residency.py): this manager's and the reload's.
        self.residency = Residency(events)
        self._remote_lock = threading.Lock()
        self._request_observers: list[Callable[[RequestTiming], None]] = []
        self._stop = threading.Event()
        self.spawns = Spawns()  # workers still loading: a shutdown kills them
        self.worker_restarts = 0
        self._reaper = threading.Thread(target=self._reap_loop, name="keep-alive", daemon=True)
        self._reaper.start()

    # -- planning and loading ------------------------------------------------------------
    def plan_for(self, record: ModelRecord, n_ctx: int | None = None, ctx_source: str | None = None) -> Plan:
        """The plan to load ``record`` with; ``n_ctx`` asks for that context instead (a reload that grows it)."""
        if self._planner is not None:
            if n_ctx is None:
                return self._planner(record)
            if "n_ctx" in inspect.signature(self._planner).parameters:
                sized: Callable[..., Plan] = self._planner
                return sized(record, n_ctx=n_ctx)
            # a planner passed in (tests, the TUI's) that sizes nothing: take the context as asked
            return replace(self._planner(record), n_ctx=n_ctx)
        from localrun.planning.facts import default_plan

        overrides = self._overrides
        if n_ctx is not None:
            from localrun.planning.planner import PlanOverrides

            overrides = replace(overrides or PlanOverrides(), n_ctx=n_ctx, ctx_source=ctx_source)
        return default_plan(record, self.settings, overrides)

    def start_handle(self, record: ModelRecord, plan: Plan) -> Any:
        """A handle on ``record`` loaded on ``plan``: a worker process, or a session on threads."""
        from localrun.planning.policies import policy_for
        from localrun.runtimes import get_runtime
        from localrun.worker.host import InProcessHandle, WorkerHandle

        runtime = get_runtime(plan.runtime)
        if "log_dir" not in plan.options:
            plan = replace(plan, options={**plan.options, "log_dir": str(self.settings.data_dir / "logs")})
        if policy_for(plan.runtime).takes_cache_options:
            plan = replace(plan, options={**self._cache_options(), **plan.options})
        if getattr(runtime, "in_worker", True):
            safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in record.name)
            log_path = self.worker_log or self.settings.data_dir / "logs" / f"worker-{safe}.log"
            return WorkerHandle(record, plan, log_path=log_path, spawns=self.spawns)
        return InProcessHandle(record, plan, runtime.load(record, plan))

    def _cache_options(self) -> dict[str, Any]:
        """The prompt cache's settings as plan options (a plan's own options win): the llama.cpp
        runtime's host-RAM and disk tiers read them (runtimes/llamacpp/cache/prefix_disk.py)."""
        cache = self.settings.cache
        return {
            "kv_dir": str(cache.kv_dir or self.settings.cache_dir / "kv"),
            "kv_disk_bytes": cache.kv_disk_bytes,
            "kv_ram_bytes": cache.kv_ram_bytes,
        }

    def load(
        self,
        name: str,
        *,
        keep_alive_s: float | None = None,
        pin: bool | None = None,
        plan_with: Planner | None = None,
        media: tuple[Media, ...] = (),
        check: MediaCheck | None = None,
    ) -> LoadedModel:
        """Load ``name`` if it is not loaded (or its worker died), planned by ``plan_with`` (default
        :meth:`plan_for`); return it. A load for a request with ``media`` is refused before it
        starts when the model cannot take them (see :func:`.activity.refuse_media_before_load`)."""
        remote = self.remote_model(name)
        if remote is not None:
            return remote
        record = self.store.resolve(name)
        key = record.name
        with self.residency.load_lock(key):
            lm = self.residency.get(key)
            if lm is not None and not lm.handle.alive:
                log.warning("worker for %s died; starting a new one", key)
                self.residency.remove(key)
                self.worker_restarts += 1
                lm = None
            if lm is None:
                plan = (plan_with or self.plan_for)(record)
                if media:
                    refuse_media_before_load(record, plan, media, check)
                self.residency.make_room(plan, self.settings.runtime.max_loaded_models)
                t0 = time.monotonic()
                handle = self.start_handle(record, plan)
                lm = LoadedModel(key, record, plan, handle, keep_alive_s=self.settings.runtime.keep_alive_s)
                log.info("loaded %s with %s on %s in %.2f s", key, plan.runtime, plan.device, time.monotonic() - t0)
                self.residency.put(lm)
                if self._stop.is_set():  # shutdown began during the load, maybe after it unloaded all
                    self.residency.unload(key, "shutting down")
                    raise Cancelled(f"{key}: the server is shutting down")
            if keep_alive_s is not None:
                lm.keep_alive_s = keep_alive_s
            if pin is not None:
                lm.pinned = pin
            lm.last_used = time.monotonic()
            return lm

    def unload(self, name: str, *, reason: str = "unloaded") -> bool:
        """Unload ``name`` (as loaded, or as the store resolves it); False when it is not loaded."""
        if self.residency.unload(name, reason):
            return True
        try:
            key = self.store.resolve(name).name
        except LocalrunError:
            return False
        return self.residency.unload(key, reason)

    def set_pin(self, name: str, pinned: bool) -> None:
        self.load(name, pin=pinned)

    def loaded(self) -> list[dict[str, Any]]:
        return [m.info() for m in self.residency.models()]

    def cache_stats(self, timeout_s: float = 5.0) -> dict[str, dict[str, Any]]:
        """Each loaded model's prompt-cache numbers (RAM and disk: entries, tokens, bytes, counters),
        for models whose runtime keeps one (capability "slots"). Never loads a model, nor counts as
        its use: ``ps`` or a /metrics scrape keeps no model alive."""
        import queue

        from localrun.worker.host import call_result
        from localrun.worker.ops import Call

        loaded = [m for m in self.residency.models() if m.handle.alive and "slots" in (m.handle.capabilities or ())]
        out: dict[str, dict[str, Any]] = {}
        for lm in loaded:
            try:
                out[lm.name] = call_result(lm.handle, Call("cache_stats", {}), timeout_s=timeout_s)
            except (LocalrunError, queue.Empty) as exc:  # unloading, or busy past the deadline: shown next time
                log.debug("no cache stats from %s: %s", lm.name, exc)
        return out

    def is_loaded(self, name: str) -> bool:
        return name in self.residency

    def shutdown(self) -> None:
        self._stop.set()
        self.spawns.close()
        for name in [m.name for m in self.residency.models()]:
            self.unload(name, reason="shutting down")
        if self.upstreams is not None:
            self.upstreams.close()

    def remote_model(self, name: str) -> LoadedModel | None:
        """The upstream model ``name`` routes to; None for a local name or when no upstream has it.

        Routing hands back an entry (record, plan, session); the LoadedModel around it is
        built here, pinned and never reaped, and rebuilt when the route's upstreams change.
        """
        entry = self._remote.get(name) if self._remote is not None else None
        if entry is None and self._remote is not None:
            from localrun.modelstore.identity import without_latest

            if (bare := without_latest(name)) is not None:  # Ollama's clients send back NAME:latest
                entry, name = self._remote.get(bare), bare
        if entry is None:
            return None
        from localrun.worker.host import InProcessHandle

        with self._remote_lock:
            lm = self._remote_loaded.get(name)
            if lm is None or lm.record is not entry.record:
                handle = InProcessHandle(entry.record, entry.plan, entry.session)
                lm = LoadedModel(
                    entry.name,
                    entry.record,
                    entry.plan,
                    handle,
                    keep_alive_s=-1.0,
                    pinned=True,
                    queue_limit=entry.queue_limit,
                )
                self._remote_loaded[name] = lm
            lm.last_used = time.monotonic()
            return lm

    # -- listings for the front ends --------------------------------------------------------
    def catalog(
        self, records: list[ModelRecord] | None = None, *, probe: bool = False, with_capabilities: bool = False
    ) -> list[CatalogEntry]:
        """Every model a client can name: the store's (``records``, read now when None), then the upstreams'.

        ``probe`` asks each upstream now instead of trusting the background prober (``localrun ls``
        has no server running, so nothing probed yet). ``with_capabilities`` fills each entry's
        ``capabilities`` (it may read a projector's header and parse a chat template: off the loop).
        """
        from localrun.modelstore.capabilities import capabilities

        def able(record: ModelRecord) -> tuple[str, ...]:
            return tuple(capabilities(record, self.settings)) if with_capabilities else ()

        local = list(self.store.list()) if records is None else list(records)
        out = [CatalogEntry(r.name, r, source_label(r), capabilities=able(r)) for r in local]
        if self.upstreams is None:
            return out
        from localrun.upstreams.routing import listed_models

        if probe:
            for st in self.upstreams.states():
                self.upstreams.probe(st)
                if st.healthy:
                    self.upstreams.refresh_models(st)
        for item in listed_models(self.upstreams, (r.name for r in local)):
            out.append(
                CatalogEntry(
                    item.name,
                    item.record,
                    source_label(item.record),
                    item.health,
                    tuple(item.route.upstreams),
                    item.route.model,
                    able(item.record),
                )
            )
        return out

    def upstream_status(self) -> list[dict[str, Any]]:
        """Each upstream's health, load and models (admin, metrics, the TUI); [] when none is configured."""
        return self.upstreams.status() if self.upstreams is not None else []

    def observe_upstreams(self, observer: Callable[..., None]) -> bool:
        """Subscribe ``observer(upstream, model, event, **values)`` to the upstream pool; False when there is none."""
        if self.upstreams is None:
            return False
        self.upstreams.observers.append(observer)
        return True

    def _reap_loop(self) -> None:
        while not self._stop.wait(1.0):
            for name in self.residency.expired():
                self.unload(name, reason="keep-alive expired")

    # -- requests --------------------------------------------------------------------------
    def ensure_context(
        self,
        name: str,
        n_ctx: int,
        *,
        source: str = "options.num_ctx",
        media: tuple[Media, ...] = (),
        check: MediaCheck | None = None,
    ) -> tuple[LoadedModel, str | None]:
        """``name`` loaded with ``n_ctx`` of context if memory allows, ``media`` refused first (see reload.py)."""
        from localrun.reload import ensure_context

        return ensure_context(self, name, n_ctx, source, media=media, check=check)

    def _load_admitted(
        self,
        name: str,
        keep_alive_s: float | None = None,
        media: tuple[Media, ...] = (),
        check: MediaCheck | None = None,
    ) -> LoadedModel:
        """Load and admit; a model replaced between the two (a reload) is loaded again, behind the reload."""
        while True:
            lm = self.load(name, keep_alive_s=keep_alive_s, media=media, check=check)
            if self.residency.admit(lm, self.settings.server.queue_size):
                return lm

    def stream(
        self,
        name: str,
        req: ChatRequest | CompletionRequest,
        cancel: Cancel | None = None,
        *,
        keep_alive_s: float | None = None,
    ) -> Iterator[Chunk]:
        """Blocking chunk stream for the CLI and the TUI's workers."""
        from localrun.activity import answer_limit, start_timing, watched
        from localrun.worker.host import iter_chunks

        req = self._forced(req)
        timing = start_timing(name, self._request_observers)
        try:
            lm = self._load_admitted(name, keep_alive_s, req.media)
        except BaseException:
            timing.end(failed=True, cancelled=cancel is not None and cancel.is_set())
            raise
        req = answer_limit(req, lm.record, lm.plan, self.settings.runtime)
        try:
            yield from watched(lm, req, iter_chunks(lm.handle, req, cancel), timing, cancel)
        finally:
            self.residency.release(lm)

    async def aopen(
        self,
        name: str,
        req: ChatRequest | CompletionRequest,
        *,
        keep_alive_s: float | None = None,
        check: MediaCheck | None = None,
    ) -> OpenStream:
        """Load and admit before any byte is sent, so load errors and 503s become proper HTTP errors.

        ``check(record, plan, media it takes)`` refuses the request's media before a load that
        could not serve them (the server's words). The returned stream must be iterated or
        ``aclose``d; either way its slot is released once.
        """
        import asyncio

        from localrun.activity import start_timing

        timing = start_timing(name, self._request_observers)
        try:
            # An upstream model already routed once is found without a thread hop (nothing to load).
            lm = self.remote_model(name) if self._remote is not None and self._remote.warm(name) else None
            if lm is None or not self.residency.admit(lm, self.settings.server.queue_size):
                lm = await asyncio.to_thread(self._load_admitted, name, keep_alive_s, req.media, check)
        except BaseException:
            timing.end(failed=True)
            raise
        from localrun.activity import OpenStream, answer_limit

        return OpenStream(
            self.residency, lm, answer_limit(self._forced(req), lm.record, lm.plan, self.settings.runtime), timing
        )

    def observe_requests(self, observer: Callable[[RequestTiming], None]) -> None:
        """Call ``observer(timing)`` as each stream starts (before its model loads), in the caller's
        context: the TUI's request log and tokens/s follow every request through its timing."""
        self._request_observers.append(observer)

    def _forced(self, req: ChatRequest | CompletionRequest) -> ChatRequest | CompletionRequest:
        """``req`` at ``runtime.force_temperature`` when that is set (every route, the CLI and a
        reasoning turn's continuation come through here)."""
        forced = self.settings.runtime.force_temperature
        if forced is None or req.sampling.temperature == forced:
            return req
        return replace(req, sampling=replace(req.sampling, temperature=forced))

    def embed(self, name: str, texts: list[str]) -> list[list[float]]:
        from localrun.worker.host import call_result
        from localrun.worker.ops import Embed

        lm = self._load_admitted(name)
        try:
            vectors: list[list[float]] = call_result(lm.handle, Embed(tuple(texts)))
            return vectors
        finally:
            self.residency.release(lm)

    def call(self, name: str, method: str, args: dict[str, Any] | None = None) -> Any:
        """One of the session extras (``runtimes.base.EXTRAS``: tokenize, rerank…), admitted like a request."""
        from localrun.worker.host import call_result
        from localrun.worker.ops import Call

        lm = self._load_admitted(name)
        try:
            return call_result(lm.handle, Call(method, dict(args or {})))
        finally:
            self.residency.release(lm)

    def resolve(self, name: str) -> ModelRecord:
        remote = self.remote_model(name)
        return remote.record if remote is not None else self.store.resolve(name)


def _pool_from(settings: Settings) -> UpstreamPool | None:
    """An upstream pool when config.toml lists upstreams; None (nothing started) otherwise."""
    if not settings.upstreams:
        return None
    from localrun.upstreams.pool import UpstreamPool

    return UpstreamPool(list(settings.upstreams), settings.upstream)
