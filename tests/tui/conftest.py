"""Fixtures for the TUI tests: deterministic hardware, the fake runtime, the tiny GGUF
imported into a fresh store, and helpers to wait on an app under Pilot."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.servers import free_port

GIB = 1024**3


def make_facts():
    """A fixed CPU-only laptop, so screens and snapshots never depend on the test machine."""
    from localrun.planning.hardware import HardwareProfile
    from localrun.runtimes.base import RuntimeStatus

    hw = HardwareProfile(
        os="linux",
        arch="x86_64",
        cpu_model="Test CPU 9000",
        physical_cores=4,
        logical_cores=8,
        cpu_flags=("avx2", "fma", "f16c"),
        ram_total=16 * GIB,
        ram_available=12 * GIB,
    )
    statuses = {
        "llama.cpp": RuntimeStatus("llama.cpp", True, "0.3.36", ("cpu",), reason="built for the CPU only"),
        "mlx": RuntimeStatus("mlx", False, reason="mlx is not installed", fix="pip install 'localrun[mlx]'"),
        "ollama": RuntimeStatus(
            "ollama", False, reason="no server at http://127.0.0.1:11434", fix="start `ollama serve`"
        ),
        "mlc": RuntimeStatus("mlc", False, reason="mlc_llm is not installed", fix="pip install from MLC's wheel index"),
    }
    return hw, statuses


@pytest.fixture
def anyio_backend():
    """Async tests run on asyncio through anyio's pytest plugin (installed with httpx)."""
    return "asyncio"


@pytest.fixture
def facts():
    return make_facts()


@pytest.fixture
def settings():
    from localrun.settings import Settings

    return Settings(runtime={"force": "fake", "keep_alive_s": 300}, server={"port": free_port()})


@pytest.fixture
def planner(settings, facts):
    from localrun.planning.planner import PlanOverrides, plan_placement

    hw, statuses = facts
    return lambda record: plan_placement(
        record, hw, statuses, overrides=PlanOverrides(runtime="fake"), settings=settings
    )


@pytest.fixture
def store(settings, tiny_gguf):
    from localrun.modelstore.store import ModelStore

    store = ModelStore(settings)
    store.import_path(tiny_gguf, name="tiny")
    return store


@pytest.fixture
def manager(settings, store, planner):
    from localrun.manager import ModelManager

    manager = ModelManager(settings, store, planner=planner)
    yield manager
    manager.shutdown()


@pytest.fixture
def make(settings, store, manager, facts):
    """Build an app (not serving unless asked) over the shared fixtures."""
    from localrun.tui import make_app

    def build(**kw):
        kw.setdefault("serve", False)
        kw.setdefault("poll_s", 0.2)
        return make_app(settings, store=store, manager=manager, facts=facts, **kw)

    return build


async def wait_for(pilot, predicate, *, timeout: float = 10.0, what: str = "condition"):
    """Let the app run until ``predicate()`` is true (thread workers need real time)."""
    deadline = time.monotonic() + timeout
    while True:
        await pilot.pause()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def screen_text(app) -> str:
    """Everything the current screen shows, as plain text, one line per row."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip) for strip in strips)
