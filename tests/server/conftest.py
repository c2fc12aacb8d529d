"""Fixtures for the server tests.

Three ways to reach the server, cheapest first:
- ``client``: the app in-process through Starlette's TestClient (no socket; responses are
  buffered, so no real streaming);
- ``live``: uvicorn in a thread of the test process on a free port (real sockets and
  streaming; the test can look at the ModelManager directly);
- ``spawn_server``: a separate server process (``python -m localrun serve`` or the test
  launcher), for what must cross a process boundary: kill -9 of a worker, refusing to
  start, what the process logs.
Most run the fake runtime; the llama.cpp ones use the tiny GGUF or Gemma.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from localrun.settings import Settings
from localrun.types import Plan

REPO = Path(__file__).resolve().parents[2]


def make_settings(**server) -> Settings:
    """Settings under the per-test LOCALRUN_HOME; ``server`` overrides the server section."""
    runtime = server.pop("runtime", {})
    return Settings(server=server, runtime=runtime)


def fake_planner(**options):
    def planner(record):
        return Plan(runtime="fake", n_ctx=2048, options=dict(options))

    return planner


@dataclasses.dataclass
class Stack:
    settings: Settings
    store: object
    manager: object


@pytest.fixture
def build_stack(tiny_gguf):
    """Make a (settings, store, manager) on the fake runtime with the tiny model as "tiny"."""
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore

    made: list[Stack] = []

    def build(*, options: dict | None = None, planner=None, **server) -> Stack:
        settings = make_settings(**server)
        store = ModelStore(settings)
        store.import_path(tiny_gguf, name="tiny")
        manager = ModelManager(settings, store, planner=planner or fake_planner(**(options or {})))
        stack = Stack(settings, store, manager)
        made.append(stack)
        return stack

    yield build
    for stack in made:
        stack.manager.shutdown()


@pytest.fixture
def stack(build_stack) -> Stack:
    return build_stack()


@pytest.fixture
def client(stack):
    from fastapi.testclient import TestClient

    from localrun.server.app import create_app

    with TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost") as c:
        yield c


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


@pytest.fixture
def live_factory():
    servers: list[LiveServer] = []

    def start(stack: Stack) -> LiveServer:
        server = LiveServer(stack)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def live(stack, live_factory) -> LiveServer:
    return live_factory(stack)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_args(port: int, options: dict | None = None, plan: dict | None = None) -> list[str]:
    """``tests.server.launch`` on ``port`` with settings ``--option`` and plan ``--plan`` pairs
    (JSON values): the argument list after ``python -m``, for every test that starts one."""
    args = ["tests.server.launch", "--port", str(port)]
    for key, value in (options or {}).items():
        args += ["--option", f"{key}={json.dumps(value)}"]
    for key, value in (plan or {}).items():
        args += ["--plan", f"{key}={json.dumps(value)}"]
    return args


class ServerProcess:
    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path):
        self.proc = proc
        self.url = url
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for_server(server: ServerProcess, timeout: float = 60.0) -> ServerProcess:
    """Until ``/health`` answers on the server's port (any status: a key may be required)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}: {server.log_text()[-2000:]}")
        try:
            httpx.get(f"{server.url}/health", timeout=1)
            return server
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"server did not become ready: {server.log_text()[-2000:]}")


@pytest.fixture
def spawn_server(tmp_path):
    """Start a server process: ``spawn_server(args, port=P, env=...)``, args after ``python -m``.

    Ready once ``/health`` answers on the port (any status: a key may be required).
    """
    started: list[ServerProcess] = []

    def spawn(args: list[str], *, port: int, env: dict | None = None, wait: bool = True, timeout: float = 60.0) -> ServerProcess:
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
        log_path = tmp_path / f"server-{len(started)}.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", *args], stdout=log_file, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
        server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
        started.append(server)
        if not wait:
            return server
        return wait_for_server(server, timeout)

    yield spawn
    for server in started:
        server.stop()


def wait_until(predicate, timeout: float, interval: float = 0.02):
    """Poll ``predicate`` until truthy; return its last value (falsy on timeout)."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = predicate()
    return value


def health(url: str, **headers) -> dict:
    return httpx.get(f"{url}/health", headers=headers, timeout=5).json()
