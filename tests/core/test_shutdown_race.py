"""A worker never outlives its server's stop, even when the stop lands while the worker loads.

Before: the manager's shutdown unloaded the models it had; a worker still loading (a first
load, or the restart of one that died) was not among them, and loaded on in its own session
after the server had gone, until its load ended. Now a shutdown kills workers still loading,
and a load that finishes after the shutdown began is unloaded at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from localrun.errors import LocalrunError
from localrun.manager import ModelManager
from localrun.runtimes.fake import FakeRuntime
from localrun.types import Plan
from tests.core.test_manager import DictStore, load_settings

LOAD_S = 30.0


def _my_workers() -> list[int]:
    """This process's worker children (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"localrun.worker" in cmdline:
            found.append(int(entry.name))
    return found


class _Pid:
    """A child process known by its pid only (a zombie counts as gone)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                return
            if state == "Z":
                return
            time.sleep(0.05)
        raise TimeoutError(self.pid)

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker in /proc")
@pytest.mark.parametrize("when", ["during the load", "just after the load"])
def test_a_worker_loading_when_the_server_stops_does_not_outlive_it(monkeypatch, when):
    monkeypatch.setattr(FakeRuntime, "in_worker", True)  # run the fake in a real worker process, as llama.cpp
    load_s = LOAD_S if when == "during the load" else 0.0
    planner = lambda record: Plan(runtime="fake", n_ctx=256, options={"fake_load_s": load_s})  # noqa: E731
    manager = ModelManager(load_settings(), DictStore("a"), planner=planner)
    outcome: list[object] = []
    procs: list = []
    if when == "just after the load":  # the shutdown lands between the worker's ready and the model's entry
        real_put = manager.residency.put

        def put_then_stop(lm):
            procs.append(lm.handle.proc)
            real_put(lm)
            manager.shutdown()

        monkeypatch.setattr(manager.residency, "put", put_then_stop)

    def load():
        try:
            outcome.append(manager.load("a"))
        except LocalrunError as exc:
            outcome.append(exc)

    loader = threading.Thread(target=load)
    loader.start()
    if when == "during the load":
        deadline = time.monotonic() + 20
        while not (pids := _my_workers()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pids, "no worker started"
        procs.extend(_Pid(pid) for pid in pids)
        time.sleep(0.5)  # the worker is in its 30 s load now
        manager.shutdown()
    loader.join(20)
    assert not loader.is_alive()
    stopped = time.monotonic()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - reported below
            proc.kill()
            pytest.fail(f"worker {proc.pid} still running {time.monotonic() - stopped:.1f} s after the shutdown")
    assert isinstance(outcome[0], LocalrunError), outcome
    assert not manager.is_loaded("a")
