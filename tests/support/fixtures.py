"""The pytest plugin of tests/support (registered in tests/conftest.py): the fixtures that start
servers, so every test folder gets them by name instead of importing another folder's conftest.

Three ways to reach a server, cheapest first:
- ``client``/``app_client``/``caps_client``: the app in-process through Starlette's TestClient
  (no socket; responses are buffered, so no real streaming);
- ``live``/``live_factory``: uvicorn in a thread of the test process (real sockets and
  streaming; the test can look at the ModelManager directly);
- ``spawn_server``/``serve``/``serve_module``: a separate process (tests.support.servers), for
  what must cross a process boundary: kill -9 of a worker, refusing to start, what it logs.
"""

from __future__ import annotations

import pytest

from tests.support import servers
from tests.support.capabilities import ALL
from tests.support.stacks import LiveServer, Stack, fake_planner, make_settings


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


def _test_client(stack: Stack, **kwargs):
    from fastapi.testclient import TestClient

    from localrun.server.app import create_app

    return TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost", **kwargs)


@pytest.fixture
def client(stack):
    with _test_client(stack) as c:
        yield c


@pytest.fixture
def app_client(build_stack):
    """``app_client(capabilities=[...], **server_settings)``: a TestClient on the fake runtime."""
    opened = []

    def make(capabilities=ALL, **server):
        stack = build_stack(planner=fake_planner(fake_capabilities=list(capabilities)), **server)
        client = _test_client(stack, raise_server_exceptions=False)
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


@pytest.fixture
def caps_client(build_stack):
    """The app in-process (fake runtime, every capability, max_tokens capped at 8), for fuzzing."""
    stack = build_stack(planner=fake_planner(fake_capabilities=list(ALL)), runtime={"max_tokens_cap": 8})
    with _test_client(stack, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def live_factory():
    started: list[LiveServer] = []

    def start(stack: Stack) -> LiveServer:
        started.append(LiveServer(stack))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def live(stack, live_factory) -> LiveServer:
    return live_factory(stack)


@pytest.fixture
def spawn_server(tmp_path):
    """``spawn_server(args, port=P, env=..., wait=True)``: a server process, args after ``python -m``,
    in this test's LOCALRUN_HOME; ready by the one rule of tests.support.servers."""
    started: list[servers.ServerProcess] = []

    def spawn(
        args: list[str], *, port: int, env: dict | None = None, wait: bool = True, timeout: float = 60.0
    ) -> servers.ServerProcess:
        from tests.support.launch import launch_env

        spec = servers.ServerSpec(list(args), port, env={**launch_env(), **(env or {})}, timeout=timeout)
        started.append(servers.start(spec, tmp_path / f"server-{len(started)}.log", wait=False))
        return started[-1].wait_ready() if wait else started[-1]

    yield spawn
    for server in started:
        server.stop()


@pytest.fixture
def serve(spawn_server):
    """``serve(path, name, runtime="fake"|"", plan={...}, **options)``: import the model into this
    test's store, start the launcher on it, return the server."""

    def start(path, name: str, *, runtime: str = "fake", plan: dict | None = None, **options):
        from localrun.modelstore.store import ModelStore
        from localrun.settings import Settings

        ModelStore(Settings()).import_path(path, name=name)
        port = servers.free_port()
        spec = servers.launcher(port, runtime=runtime, options=options, plan=plan)
        return spawn_server(spec.args, port=port, env={"LOCALRUN_RUNTIME__FORCE": runtime})

    return start


@pytest.fixture(scope="module")
def serve_module(tmp_path_factory):
    """``serve_module(path, name="tiny", plan={...}, env={...}, **options)``: one real server process
    (llama.cpp picked by the planner) for a whole test module, in a LOCALRUN_HOME of its own, so a
    module's tests share one model load."""
    started: list[servers.ServerProcess] = []

    def start(
        path, name: str = "tiny", *, plan: dict | None = None, env: dict | None = None, **options
    ) -> servers.ServerProcess:
        home = tmp_path_factory.mktemp("clients-home")
        servers.import_model(home, path, name)
        spec = servers.llama_tiny(servers.free_port(), home=home, plan=plan, **options)
        spec.env.update(env or {})
        spec.timeout = 60.0
        started.append(servers.start(spec, home / "server.log"))
        return started[-1]

    yield start
    for server in started:
        server.stop()
