"""Fixtures for the upstream tests: real localrun servers as upstreams, a front localrun
that routes to them, and helpers to stop, break and restart an upstream.

The upstreams here are real HTTP servers on 127.0.0.1 (uvicorn in a thread, or a process
where it must be killed); the fake runtime behind some of them only makes their answers
cheap and slow enough to cut mid-stream. The tests that prove a real engine works use
llama.cpp on the tiny GGUF (tests/upstreams/test_real_engines.py) and vLLM (test_vllm.py).
"""

from __future__ import annotations

import pytest

from tests.support.stacks import Front, LiveServer, front_with_upstreams


@pytest.fixture
def front_factory(tiny_gguf, live_factory, tmp_path_factory):
    """``front(upstreams=[dict…], local=("name",…), routing=…, **upstream_settings)``: a live front server."""
    made = []

    def build(upstreams: list[dict], *, local: tuple[str, ...] = (), queue_size: int = 16, **upstream) -> Front:
        # its own store: the upstreams' models are not local here
        stack = front_with_upstreams(
            tmp_path_factory.mktemp("front"), upstreams, model=tiny_gguf, local=local, queue_size=queue_size, **upstream
        )
        made.append(stack.manager)
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
