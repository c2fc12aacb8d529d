"""Fixtures for the upstream tests: real localrun servers as upstreams, a front localrun
that routes to them, and helpers to stop, break and restart an upstream.

The upstreams here are real HTTP servers on 127.0.0.1 (uvicorn in a thread, or a process
where it must be killed); the fake runtime behind some of them only makes their answers
cheap and slow enough to cut mid-stream. The tests that prove a real engine works use
llama.cpp on the tiny GGUF (tests/upstreams/test_real_engines.py) and vLLM (test_vllm.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from localrun.settings import Settings
from localrun.settings import UpstreamConfig
from tests.server.conftest import (  # noqa: F401 - fixtures reused by name
    LiveServer, Stack, build_stack, fake_planner, free_port, live_factory, spawn_server, wait_until,
)

FAST = {"probe_interval_s": 0.3, "cooldown_s": 30.0}


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


@pytest.fixture
def front_factory(tiny_gguf, live_factory, tmp_path_factory):
    """``front(upstreams=[dict…], local=("name",…), routing=…, **upstream_settings)``: a live front server."""
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.upstreams.pool import UpstreamPool

    made: list[ModelManager] = []

    def build(upstreams: list[dict], *, local: tuple[str, ...] = (), queue_size: int = 16, **upstream) -> Front:
        home = tmp_path_factory.mktemp("front")  # its own store: the upstreams' models are not local here
        settings = Settings(data_dir=home / "data", cache_dir=home / "cache", server={"queue_size": queue_size},
                            upstream={**FAST, **upstream}, upstreams=[UpstreamConfig(**u) for u in upstreams])
        store = ModelStore(settings)
        for name in local:
            store.import_path(tiny_gguf, name=name)
        pool = UpstreamPool(list(settings.upstreams), settings.upstream)
        manager = ModelManager(settings, store, planner=fake_planner(), upstreams=pool)
        made.append(manager)
        wait_until(lambda: all(st.healthy is not None and st.discovery_tried for st in pool.states()), 10)  # first probes done
        stack = Stack(settings, store, manager)
        return Front(stack, live_factory(stack))

    yield build
    for manager in made:
        manager.shutdown()


@pytest.fixture
def fake_upstream(build_stack, live_factory):
    """``fake_upstream(**plan_options)``: a live localrun on the fake runtime serving "tiny"."""

    def start(**options) -> LiveServer:
        return live_factory(build_stack(options=options))

    return start


@pytest.fixture
def replays():
    """``replays(routes)``: a recorded-response server (tests/upstreams/replay.py), closed afterwards."""
    from tests.upstreams.replay import Replay

    made = []

    def start(routes):
        made.append(Replay(routes))
        return made[-1]

    yield start
    for r in made:
        r.close()
