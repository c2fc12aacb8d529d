"""In-process servers: a (settings, store, manager) stack on the fake runtime, served live by
uvicorn in a thread, and a front localrun that routes to upstreams. A test that must look at
the ModelManager while requests run uses these instead of a process (tests.support.servers)."""

from __future__ import annotations

import dataclasses
import threading

from localrun.settings import Settings
from localrun.types import Plan

#: Upstream probing fast enough for a test to watch an upstream fail and come back.
FAST_UPSTREAM = {"probe_interval_s": 0.3, "cooldown_s": 30.0}


def make_settings(**server) -> Settings:
    """Settings under the per-test LOCALRUN_HOME; ``server`` overrides the server section."""
    runtime = server.pop("runtime", {})
    return Settings(server=server, runtime=runtime)


def fake_planner(**options):
    """Every model on the fake runtime, with these plan options (``fake_capabilities=[...]``)."""

    def planner(record):
        return Plan(runtime="fake", n_ctx=2048, options=dict(options))

    return planner


@dataclasses.dataclass
class Stack:
    settings: Settings
    store: object
    manager: object


class LiveServer:
    """uvicorn serving the app in a thread, bound by uvicorn itself to a free port."""

    def __init__(self, stack: Stack):
        from localrun.server.serve import build_server

        self.stack = stack
        settings = stack.settings.model_copy(update={"server": stack.settings.server.model_copy(update={"port": 0})})
        ready = threading.Event()
        self.url = ""

        def on_ready(url: str) -> None:
            self.url = url
            ready.set()

        self.server = build_server(settings, stack.manager, ready_callback=on_ready)
        self.thread = threading.Thread(target=self.server.run, name="live-server", daemon=True)
        self.thread.start()
        if not ready.wait(15):
            raise RuntimeError("the live server did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@dataclasses.dataclass
class Front:
    """The localrun that routes to the upstreams, served live."""

    stack: Stack
    server: LiveServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def pool(self):
        return self.stack.manager.upstreams


def front_with_upstreams(
    home, upstreams: list[dict], *, model=None, local: tuple[str, ...] = (), queue_size: int = 16, **upstream
) -> Stack:
    """A front's stack: a store of its own under ``home`` (the upstreams' models are not local
    there; ``local`` names are ``model`` imported), routing to ``upstreams``, probed once."""
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.settings import UpstreamConfig
    from localrun.upstreams.pool import UpstreamPool
    from tests.support.servers import wait_until

    settings = Settings(
        data_dir=home / "data",
        cache_dir=home / "cache",
        server={"queue_size": queue_size},
        upstream={**FAST_UPSTREAM, **upstream},
        upstreams=[UpstreamConfig(**u) for u in upstreams],
    )
    store = ModelStore(settings)
    for name in local:
        store.import_path(model, name=name)
    pool = UpstreamPool(list(settings.upstreams), settings.upstream)
    manager = ModelManager(settings, store, planner=fake_planner(), upstreams=pool)
    wait_until(lambda: all(st.healthy is not None and st.discovery_tried for st in pool.states()), 10)  # first probes
    return Stack(settings, store, manager)


def in_flight_by_model(manager) -> dict[str, int]:
    """Requests each model's worker is still running (0 once a cancelled generation has stopped)."""
    return {info["name"]: int(info.get("in_flight", 0)) for info in manager.loaded()}
