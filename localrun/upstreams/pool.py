"""The upstreams as one pool: which serves what, how loaded and healthy each is, who gets a request.

* **Catalog.** Each upstream's models come from its ``models`` list or its ``/v1/models``
  (re-read every ``upstream.refresh_models_s``). A name several upstreams serve is one
  model served by all of them (LiteLLM's deployment group); ``UPSTREAM/MODEL`` always
  reaches that one upstream (llama-swap's rule). The manager lets a local model win a bare
  name and lists the upstream's as ``UPSTREAM/MODEL``, so neither hides the other.
* **Routing.** Least outstanding requests, weighted (in flight ÷ weight, ties to the one
  sent least); or prefix affinity: a prompt whose first ``affinity_prefix_chars`` match a
  recent one goes where that one went, so the engine's prefix cache hits, unless that
  upstream is much busier than the idlest (the SGLang/vLLM routers' cache-aware rule).
* **Health.** Passive first: a request that succeeds counts as a passing probe. A thread
  probes each kind's own health endpoint every ``probe_interval_s``, but only an upstream
  that is idle (nothing in flight) and has had no success since the last round: some
  engines (llama-cpp-python's server) cancel the stream they are running whenever another
  request arrives, so a probe landing mid-stream cut the client's answer. While a probe is
  out, a new request waits for it (a few milliseconds; at most the probe's timeout) rather
  than meet it. A request that fails (connect, timeout, 5xx, broken stream, key refused)
  puts its upstream in cooldown for ``cooldown_s`` and wakes the prober. A cooling or
  failing upstream gets no requests — unless no other candidate is left: the only server
  of a model is never shut off by localrun, its own error goes to the client. A passing
  probe, or a request that succeeds, ends the cooldown.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localrun.errors import Overloaded
from localrun.settings import UpstreamConfig, UpstreamSettings

if TYPE_CHECKING:
    from localrun.runtimes.openai_compat.client import OpenAIClient

log = logging.getLogger(__name__)

AFFINITY_ENTRIES = 4096


@dataclass
class UpstreamState:
    """One upstream as the pool sees it now."""

    config: UpstreamConfig
    client: Any  # localrun.runtimes.openai_compat.client.OpenAIClient (or a test stand-in)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # model id -> its /v1/models entry
    discovered: bool = False
    discovery_tried: bool = False
    discovery_error: str = ""
    discovered_at: float = 0.0
    in_flight: int = 0
    sent: int = 0
    healthy: bool | None = None  # None until the first probe
    detail: str = ""
    latency_s: float | None = None
    version: str | None = None
    cooldown_until: float = 0.0
    cooldowns: int = 0
    last_ok: float = 0.0  # when a request last succeeded here (a passing probe, passively)
    probing: bool = False  # a health probe is out: requests wait for it rather than meet it
    probes: int = 0  # active probes sent
    discovery_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return self.config.name

    def cooling(self, now: float | None = None) -> bool:
        return (now or time.monotonic()) < self.cooldown_until

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        health = "unknown" if self.healthy is None else ("up" if self.healthy else "down")
        if self.healthy is not False and self.cooling(now):
            health = "cooldown"
        return {
            "name": self.name,
            "url": self.config.url,
            "kind": self.config.kind,
            "health": health,
            "detail": self.detail,
            "models": sorted(self.models),
            "in_flight": self.in_flight,
            "max_concurrency": self.config.max_concurrency,
            "weight": self.config.weight,
            "latency_ms": None if self.latency_s is None else round(self.latency_s * 1000, 1),
            "version": self.version or None,
            "cooldowns": self.cooldowns,
            "cooldown_left_s": round(max(0.0, self.cooldown_until - now), 1),
            "discovery_error": self.discovery_error,
        }


@dataclass(frozen=True)
class Route:
    """Where a requested name goes: the model id upstreams know, and which of them serve it."""

    name: str  # the name the client used, as localrun shows it
    model: str  # the id the upstreams know
    upstreams: tuple[str, ...]
    pinned: bool  # "UPSTREAM/MODEL": that upstream only


def affinity_key(text: str, chars: int) -> str | None:
    """A hash of the prompt's first ``chars`` characters; None for a prompt shorter than that."""
    if len(text) < chars:
        return None
    return hashlib.blake2b(text[:chars].encode("utf-8", "replace"), digest_size=12).hexdigest()


class UpstreamPool:
    """Every configured upstream, their catalog, load, health and routing. Thread-safe."""

    def __init__(
        self,
        upstreams: list[UpstreamConfig],
        settings: UpstreamSettings,
        *,
        client_factory: Callable[[UpstreamConfig], Any] | None = None,
        start: bool = True,
    ):
        self.settings = settings
        factory = client_factory or (lambda cfg: make_client(cfg, settings))
        self._states: dict[str, UpstreamState] = {c.name: UpstreamState(c, factory(c)) for c in upstreams}
        for st in self._states.values():
            if st.config.models:
                st.models = {m: {"id": m} for m in st.config.models}
                st.discovered = True
        self._cond = threading.Condition()
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self._wake = threading.Event()
        self._stop = threading.Event()
        #: Callables ``(upstream, model, event, **values)`` the server's metrics subscribe.
        self.observers: list[Callable[..., None]] = []
        self._thread: threading.Thread | None = None
        if start and self._states:
            self._thread = threading.Thread(target=self._probe_loop, name="upstream-probes", daemon=True)
            self._thread.start()

    # -- catalog -------------------------------------------------------------------------
    def states(self) -> list[UpstreamState]:
        return list(self._states.values())

    def get(self, name: str) -> UpstreamState | None:
        return self._states.get(name)

    def catalog(self) -> dict[str, tuple[str, ...]]:
        """Model id -> the upstreams serving it, in configuration order."""
        out: dict[str, list[str]] = {}
        for st in self._states.values():
            for model in st.models:
                out.setdefault(model, []).append(st.name)
        return {m: tuple(names) for m, names in out.items()}

    def route(self, name: str) -> Route | None:
        """Where ``name`` goes: ``UPSTREAM/MODEL`` first, else a bare model id; None if no upstream has it."""
        self._discover_untried()
        head, sep, rest = name.partition("/")
        st = self._states.get(head) if sep else None
        if st is not None and rest in st.models:
            return Route(name, rest, (st.name,), True)
        servers = self.catalog().get(name)
        return Route(name, name, servers, False) if servers else None

    def discovery_done(self) -> bool:  # an upstream that was down at first is re-read by the prober
        """Every upstream's model list was asked for once (routing a name does no I/O then)."""
        return all(st.discovery_tried for st in self._states.values())

    def _discover_untried(self) -> None:
        """Read the model list of upstreams never asked yet, so a first request sees every server of its model."""
        if all(st.discovery_tried for st in self._states.values()):
            return
        for st in self._states.values():
            if not st.discovery_tried:
                with st.discovery_lock:
                    tried = st.discovery_tried  # the prober may have just done it
                if not tried:
                    self.refresh_models(st)

    def refresh_models(self, st: UpstreamState) -> None:
        """Re-read ``/v1/models`` of an upstream whose models are not listed in its configuration."""
        if st.config.models:
            st.discovery_tried = True
            return
        from localrun.errors import LocalrunError

        with st.discovery_lock:
            try:
                rows = st.client.models(timeout_s=st.config.connect_timeout_s + 5)
            except LocalrunError as exc:
                st.discovery_error = exc.message
                log.info("upstream %s: cannot list its models: %s", st.name, exc.message)
                return
            finally:
                st.discovery_tried = True
            st.models = {r["id"]: r for r in rows}
            st.discovered, st.discovery_error, st.discovered_at = True, "", time.monotonic()

    # -- routing -------------------------------------------------------------------------
    def _candidates(self, names: tuple[str, ...], exclude: set[str]) -> list[UpstreamState]:
        """The upstreams a request may go to now: healthy and not cooling, else (none left) any not tried."""
        now = time.monotonic()
        left = [self._states[n] for n in names if n in self._states and n not in exclude]
        good = [st for st in left if st.healthy is not False and not st.cooling(now)]
        return good or left

    def _choose(self, cands: list[UpstreamState], key: str | None) -> UpstreamState:
        free = [st for st in cands if st.in_flight < st.config.max_concurrency]
        least = min(free, key=lambda st: (st.in_flight / st.config.weight, st.sent / st.config.weight))
        if key is None or self.settings.routing != "prefix-affinity":
            return least
        sticky = self._states.get(self._affinity.get(key, ""))
        if sticky is not None and sticky in free:
            gap = sticky.in_flight - least.in_flight
            if gap <= self.settings.affinity_max_imbalance or sticky.in_flight <= 1.5 * least.in_flight:
                self._affinity.move_to_end(key)
                return sticky
        self._affinity[key] = least.name
        self._affinity.move_to_end(key)
        while len(self._affinity) > AFFINITY_ENTRIES:
            self._affinity.popitem(last=False)
        return least

    def acquire(
        self,
        route: Route,
        *,
        exclude: set[str],
        key: str | None,
        wait_s: float,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> UpstreamState | None:
        """Take a slot on the best upstream for ``route``; None when every candidate was tried.

        Waits (up to ``wait_s``) while every candidate is at its ``max_concurrency``.

        Raises:
            Overloaded: all candidates stayed full for ``wait_s`` (the server answers 503 + Retry-After).
        """
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                cands = self._candidates(route.upstreams, exclude)
                if not cands:
                    return None
                ready = [st for st in cands if not st.probing]
                if any(st.in_flight < st.config.max_concurrency for st in ready):
                    st = self._choose(ready, key)
                    st.in_flight += 1
                    st.sent += 1
                    return st
                left = deadline - time.monotonic()
                if left <= 0 or cancelled():
                    names = ", ".join(st.name for st in cands)
                    raise Overloaded(
                        f"every upstream serving {route.name} is at its max_concurrency ({names})",
                        hint="retry in a moment, or raise max_concurrency of the upstreams",
                    )
                self._cond.wait(min(left, 0.1))

    def release(self, st: UpstreamState) -> None:
        with self._cond:
            st.in_flight -= 1
            self._cond.notify_all()

    # -- health --------------------------------------------------------------------------
    def mark_success(self, st: UpstreamState) -> None:
        """A request succeeded on ``st``: as good as a passing probe (it ends a cooldown), and the
        prober leaves ``st`` alone until it has been idle a whole round."""
        with self._cond:
            was = st.healthy
            st.healthy, st.last_ok = True, time.monotonic()
            if st.cooling():
                st.cooldown_until, st.detail = 0.0, ""
            self._cond.notify_all()
        if was is False:
            log.info("upstream %s is up (a request succeeded)", st.name)

    def _take_for_probe(self, st: UpstreamState, now: float) -> bool:
        """Claim ``st`` for a probe when it is idle and no request passed since the last round."""
        with self._cond:
            if st.in_flight > 0 or st.probing:
                return False
            if st.healthy and now - st.last_ok < self.settings.probe_interval_s and not st.cooling(now):
                return False
            st.probing = True
            return True

    def mark_failure(self, st: UpstreamState, model: str, error: BaseException) -> None:
        """A request failed on ``st``: cool it down (connect, timeout, 5xx, stream, key) and probe it soon."""
        kind = getattr(error, "error_kind", "error")
        self.observe(st.name, model, "error", error_kind=kind)
        if kind in ("http_4xx",) or self.settings.cooldown_s <= 0:
            return
        with self._cond:
            if not st.cooling():
                st.cooldowns += 1
                self.observe(st.name, model, "cooldown")
            st.cooldown_until = time.monotonic() + self.settings.cooldown_s
            st.detail = getattr(error, "message", str(error))[:300]
        log.warning("upstream %s cooling down for %.0f s: %s", st.name, self.settings.cooldown_s, st.detail)
        self._wake.set()

    def probe(self, st: UpstreamState) -> None:
        st.probes += 1
        result = st.client.probe(timeout_s=min(5.0, st.config.connect_timeout_s + 2))
        with self._cond:
            was = st.healthy
            st.healthy, st.latency_s = result.ok, result.latency_s
            if result.ok:
                st.cooldown_until, st.detail = 0.0, ""
            else:
                st.detail = result.detail
            self._cond.notify_all()
        if was is not result.ok:
            log.info(
                "upstream %s is %s%s", st.name, "up" if result.ok else "down", "" if result.ok else f": {result.detail}"
            )
        if result.ok and st.version is None:
            st.version = st.client.version() or ""  # asked once: "" is "it does not say"

    def probe_all(self) -> None:
        now = time.monotonic()
        for st in list(self._states.values()):
            if not self._take_for_probe(st, now):
                continue  # busy, or a request just passed: it is known healthy, and a probe could cut it
            try:
                self.probe(st)
                stale = now - st.discovered_at > self.settings.refresh_models_s
                if st.healthy and (not st.discovered or stale):
                    self.refresh_models(st)
            finally:
                with self._cond:
                    st.probing = False
                    self._cond.notify_all()

    def _probe_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.probe_all()
            except Exception:  # noqa: BLE001 - the prober must outlive one upstream's odd answer
                log.exception("upstream probe failed")
            self._wake.wait(self.settings.probe_interval_s)
            self._wake.clear()

    def observe(self, upstream: str, model: str, event: str, **values: Any) -> None:
        for fn in list(self.observers):
            try:
                fn(upstream, model, event, **values)
            except Exception:  # noqa: BLE001 - a metrics bug must not fail a request
                log.exception("upstream observer failed")

    def status(self) -> list[dict[str, Any]]:
        return [st.status() for st in self._states.values()]

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        for st in self._states.values():
            st.client.close()


def make_client(cfg: UpstreamConfig, settings: UpstreamSettings) -> OpenAIClient:
    """The HTTP client of one upstream: its kind, key, timeouts and TLS trust."""
    from localrun.runtimes.openai_compat.client import OpenAIClient
    from localrun.runtimes.openai_compat.kinds import get_kind
    from localrun.runtimes.openai_compat.watch import Timeouts

    verify: bool | ssl.SSLContext = True
    bundle = cfg.ca_bundle or settings.ca_bundle
    if bundle:
        try:
            verify = ssl.create_default_context(cafile=bundle)
        except (OSError, ssl.SSLError) as exc:
            from localrun.errors import ConfigError

            raise ConfigError(
                f"upstream {cfg.name!r}: cannot read the CA bundle {bundle}: {exc}",
                hint="point ca_bundle at a PEM file of CA certificates",
            ) from None
    timeouts = Timeouts(cfg.connect_timeout_s, cfg.first_byte_timeout_s, cfg.chunk_timeout_s)
    return OpenAIClient(
        cfg.url,
        server=f"upstream {cfg.name!r}",
        upstream=cfg.name,
        kind=get_kind(cfg.kind),
        key=cfg.api_key(),
        timeouts=timeouts,
        verify=verify,
    )
