"""The manager's table of loaded models: who is loaded, how requests are counted against each,
and the rules that change the table safely while other clients are being served.

One :class:`Residency` per :class:`~localrun.manager.ModelManager`. It holds the table, the lock
over it, one load lock per model (a second request for a model that is loading waits for that
load instead of starting another), and the condition a request's end signals. The manager and
the reload with a larger context (``localrun/reload.py``) both change the table through its
public methods only: get, put, unload, replace (a row swapped once its requests are done), wait
idle and make room (evicting idle models for a new one).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localrun.errors import Overloaded
from localrun.types import ModelRecord, Plan

log = logging.getLogger(__name__)
#: A reload is what a waiting user wants to know of: its line goes to the request activity log.
activity_log = logging.getLogger("localrun.activity")

#: ``(record, plan) -> handle``: how a model is started (the manager's ``start_handle``).
Starter = Callable[[ModelRecord, Plan], Any]


@dataclass
class LoadedModel:
    """One row of the table: a model, the plan it was loaded on, its handle and its bookkeeping."""

    name: str
    record: ModelRecord
    plan: Plan
    handle: Any
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    keep_alive_s: float = 300.0  # negative: never unload on idle
    pinned: bool = False
    active: int = 0  # requests admitted (queued or running)
    queue_limit: int | None = None  # admission bound; None: server.queue_size
    retired: bool = False  # being replaced (a reload with a larger context): admit nothing more

    def idle_s(self) -> float:
        return 0.0 if self.active else time.monotonic() - self.last_used

    def ttl_left_s(self) -> float | None:
        if self.pinned or self.keep_alive_s < 0:
            return None
        return max(0.0, self.keep_alive_s - self.idle_s()) if not self.active else self.keep_alive_s

    def info(self) -> dict[str, Any]:
        mem = self.plan.memory.total if self.plan.memory else None
        ttl = self.ttl_left_s()
        return {
            "name": self.name,
            "runtime": self.plan.runtime,
            "device": self.plan.device,
            "pid": self.handle.pid,
            "n_ctx": self.plan.n_ctx,
            "n_slots": self.plan.options.get("n_slots", 1),  # requests decoded at once (the web page shows it)
            "memory_bytes": mem,
            "loaded_at": self.loaded_at,
            "idle_s": round(self.idle_s(), 1),
            "ttl_left_s": None if ttl is None else round(ttl, 1),
            "pinned": self.pinned,
            "active": self.active,
            "in_flight": self.handle.in_flight,
        }


class Residency:
    """The table of loaded models, its lock and its load locks (see the module doc)."""

    def __init__(self, events: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._events = events
        self._models: dict[str, LoadedModel] = {}
        self._lock = threading.RLock()
        self._released = threading.Condition(self._lock)  # notified whenever a request ends
        self._load_locks: dict[str, threading.Lock] = {}

    # -- reading -----------------------------------------------------------------------------
    def get(self, name: str) -> LoadedModel | None:
        with self._lock:
            return self._models.get(name)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._models

    def models(self) -> list[LoadedModel]:
        """The rows now, in load order (a copy: the table may change as soon as it is returned)."""
        with self._lock:
            return list(self._models.values())

    def expired(self) -> list[str]:
        """Models whose keep-alive has run out."""
        with self._lock:
            return [m.name for m in self._models.values() if m.ttl_left_s() == 0.0]

    # -- changing ----------------------------------------------------------------------------
    def load_lock(self, name: str) -> threading.Lock:
        """The lock a load (or a reload) of ``name`` holds: requests for it queue behind that load."""
        with self._lock:
            return self._load_locks.setdefault(name, threading.Lock())

    def put(self, lm: LoadedModel) -> None:
        """Add (or replace) ``lm``'s row and say it is loaded."""
        with self._lock:
            self._models[lm.name] = lm
        self.emit({"event": "loaded", "model": lm.name})

    def remove(self, name: str) -> LoadedModel | None:
        """Take ``name``'s row out without closing it (a dead worker's); None when it has none."""
        with self._lock:
            return self._models.pop(name, None)

    def unload(self, name: str, reason: str) -> bool:
        """Take ``name``'s row out and close its handle; False when it has none."""
        lm = self.remove(name)
        if lm is None:
            return False
        lm.handle.close()
        log.info("%s: %s", lm.name, reason)
        self.emit({"event": "unloaded", "model": lm.name, "reason": reason})
        return True

    def emit(self, event: dict[str, Any]) -> None:
        """Tell the listener (the TUI, ``launch``) that the table changed."""
        if self._events:
            try:
                self._events(event)
            except Exception:  # noqa: BLE001 - a listener's bug must not break loading
                log.exception("event listener failed")

    # -- requests ----------------------------------------------------------------------------
    def admit(self, lm: LoadedModel, limit: int) -> bool:
        """Count a request against ``lm``'s queue (``lm.queue_limit`` or ``limit``); False when
        ``lm`` is being replaced (load it again).

        Raises:
            Overloaded: the queue is full.
        """
        with self._lock:
            if lm.retired:
                return False
            limit = lm.queue_limit or limit
            if lm.active >= limit:
                raise Overloaded(f"{lm.name} has {lm.active} requests queued (limit {limit})", hint="retry in a moment")
            lm.active += 1
            return True

    def release(self, lm: LoadedModel) -> None:
        """A request on ``lm`` ended."""
        with self._lock:
            lm.active -= 1
            lm.last_used = time.monotonic()
            self._released.notify_all()

    def wait_idle(self, lm: LoadedModel) -> float:
        """Admit nothing more to ``lm``, wait until its requests have ended and take its row out
        (not closed); the seconds waited."""
        with self._lock:
            lm.retired = True
            waited = time.monotonic()
            while lm.active > 0:
                self._released.wait(1.0)
            self._models.pop(lm.name, None)
            return time.monotonic() - waited

    def replace(self, old: LoadedModel, plan: Plan, start: Starter) -> LoadedModel:
        """``old`` replaced by the same model on ``plan``, once its in-flight requests are done.

        Holds the model's load lock throughout, so new requests for it queue behind the swap;
        a row another request grew to at least ``plan``'s context meanwhile is kept as it is.
        """
        key = old.name
        with self.load_lock(key):
            current = self.get(key)
            if current is not None and current is not old and current.plan.n_ctx >= plan.n_ctx:
                return current  # another request grew it meanwhile
            old = current or old
            waited = self.wait_idle(old)
            activity_log.info(
                "reloading %s with a %d-token context (was %d; waited %.1f s for %s)",
                key,
                plan.n_ctx,
                old.plan.n_ctx,
                waited,
                "in-flight requests" if waited > 0.05 else "nothing",
            )
            old.handle.close()
            self.emit({"event": "unloaded", "model": key, "reason": f"reloading with context {plan.n_ctx}"})
            handle = start(old.record, plan)
            now = time.monotonic()
            lm = dataclasses.replace(
                old, plan=plan, handle=handle, loaded_at=time.time(), last_used=now, active=0, retired=False
            )
            self.put(lm)
            return lm

    def make_room(self, plan: Plan, max_loaded: int) -> None:
        """Evict idle, unpinned models (least recently used first) until the cap and memory allow
        one more on ``plan``.

        Raises:
            Overloaded: ``max_loaded`` models are loaded and none is idle.
        """
        need = plan.memory.total if plan.memory else 0
        while True:
            loaded = self.models()
            over_cap = len(loaded) >= max_loaded
            available = available_memory() if need else None
            short = available is not None and need > available
            if not (over_cap or short):
                return
            victims = sorted((m for m in loaded if not m.active and not m.pinned), key=lambda m: m.last_used)
            if not victims:
                if over_cap:
                    raise Overloaded(
                        f"{len(loaded)} models are loaded and none is idle (cap {max_loaded})",
                        hint="retry when a request finishes, unload a model, or raise runtime.max_loaded_models",
                    )
                return  # memory looks short but nothing can go: let the load try
            why = "the loaded-model cap" if over_cap else "memory for the new model"
            log.info("evicting %s (idle %.0f s) to make room: %s", victims[0].name, victims[0].idle_s(), why)
            self.unload(victims[0].name, reason=f"evicted for {why}")


def available_memory() -> int | None:
    """Memory the system could give a new model now; None when psutil is not installed."""
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)
