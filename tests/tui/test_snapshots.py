"""SVG snapshots of the stable screens (pytest-textual-snapshot): fixed hardware, a fixed
model record (no temporary paths on screen), nothing loaded, nothing served, no blinking
cursor. Update after a deliberate change with ``pytest tests/tui --snapshot-update``."""

from __future__ import annotations

import time

import pytest

from localrun.types import FileEntry, Format, ModelRecord, Source

pytestmark = pytest.mark.timeout(120)

RECORDS = (
    ModelRecord(
        "qwen2.5-0.5b-instruct:q4_k_m",
        Format.GGUF,
        "/models/qwen2.5-0.5b-instruct-q4_k_m.gguf",
        files=(FileEntry("/models/qwen2.5-0.5b-instruct-q4_k_m.gguf", 397_808_192),),
        source=Source.HUB,
        owned=True,
        repo="Qwen/Qwen2.5-0.5B-Instruct-GGUF",
        metadata={
            "architecture": "qwen2",
            "quant": "Q4_K_M",
            "context_length": 32768,
            "block_count": 24,
            "embedding_length": 896,
            "head_count": 14,
            "head_count_kv": 2,
            "parameters": 494_032_768,
        },
    ),
    ModelRecord(
        "tiny",
        Format.GGUF,
        "/models/tiny.gguf",
        files=(FileEntry("/models/tiny.gguf", 552_000),),
        metadata={"architecture": "llama", "quant": "F32", "context_length": 256},
    ),
)


class FixedStore:
    """A store whose records never change: what the library screen needs, nothing more."""

    def list(self):
        return list(RECORDS)

    def resolve(self, name):
        from localrun.errors import ModelNotFound

        for r in RECORDS:
            if r.name == name:
                return r
        raise ModelNotFound(name)


@pytest.fixture
def snap_app(settings, facts, monkeypatch):
    from localrun.manager import ModelManager
    from localrun.planning.planner import plan_placement
    from localrun.tui import make_app

    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(
        "localrun.modelstore.hub.check_reachable", lambda *a, **k: None
    )  # same picture with or without a network
    hw, statuses = facts
    store = FixedStore()
    manager = ModelManager(settings, store, planner=lambda r: plan_placement(r, hw, statuses, settings=settings))
    app = make_app(settings, store=store, manager=manager, facts=facts, serve=False)
    yield app
    manager.shutdown()


def settle(*texts: str, keys: tuple[str, ...] = ()):
    """run_before: press ``keys``, wait until the thread workers have filled the screen,
    then stop cursors blinking."""

    async def run(pilot):
        from textual.widgets import Input

        from tests.tui.conftest import screen_text

        await pilot.pause(0.2)
        await pilot.press(*keys)
        deadline = time.monotonic() + 10
        while not all(t in screen_text(pilot.app) for t in texts):
            assert time.monotonic() < deadline, f"screen never showed {texts}:\n{screen_text(pilot.app)}"
            await pilot.pause(0.05)
        for widget in pilot.app.screen.query(Input):
            widget.cursor_blink = False
        await pilot.pause(0.1)

    return run


def test_library(snap_compare, snap_app):
    assert snap_compare(snap_app, terminal_size=(100, 32), run_before=settle("tiny", "verdict", "● fits"))


def test_library_80x24(snap_compare, snap_app):
    assert snap_compare(snap_app, terminal_size=(80, 24), run_before=settle("tiny", "verdict"))


def test_hardware(snap_compare, snap_app):
    assert snap_compare(
        snap_app, terminal_size=(100, 32), run_before=settle("Test CPU 9000", "llama.cpp: ready", keys=("3",))
    )


def test_server_not_serving(snap_compare, snap_app):
    assert snap_compare(snap_app, terminal_size=(100, 32), run_before=settle("Not serving", keys=("4",)))


def test_discover_empty(snap_compare, snap_app):
    assert snap_compare(snap_app, terminal_size=(80, 24), run_before=settle("hub: https://huggingface.co", keys=("2",)))


def test_chat_80x24(snap_compare, snap_app):
    """The model on a row of its own (a long name shows whole), the prompt with the focus bar, F1–F5 tabs."""
    assert snap_compare(snap_app, terminal_size=(80, 24), run_before=settle("F1 Library", "max", keys=("5",)))
