"""One way to start a server process for a test: a :class:`ServerSpec`, :func:`start` and its
one readiness rule, and the presets the tests build their servers from.

The readiness rule, for every kind of server: poll ``GET <ready_path>`` until it answers with a
status below 500 (a key may be required, so 401 counts) within the deadline; if the process
exits first, or the deadline passes, fail with the tail of the server's own log, which is what
the person reading the failure needs.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.capabilities import ALL
from tests.support.launch import REPO, launch_args, launch_env, serve_args


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServerSpec:
    """How to start one server process and how to tell that it is ready."""

    args: list[str]  # after ``python -m``
    port: int
    host: str = "127.0.0.1"  # where the tests reach it
    env: dict | None = None  # the child's whole environment; None: launch_env()
    prefix: list[str] = field(default_factory=list)  # runs it elsewhere: ``ip netns exec NS``
    ready_path: str = "/health"
    headers: dict | None = None
    timeout: float = 60.0
    stop_signal: int = signal.SIGTERM
    new_session: bool = False  # its own process group, so a kill reaches what it spawned

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class ServerProcess:
    """A started server: its process, log file and the spec it was started from."""

    def __init__(self, proc: subprocess.Popen, spec: ServerSpec, log_path: Path):
        self.proc = proc
        self.spec = spec
        self.url = spec.url
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self) -> ServerProcess:
        """The one readiness rule (see the module docstring)."""
        deadline = time.monotonic() + self.spec.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_text()[-3000:]}")
            try:
                if httpx.get(self.url + self.spec.ready_path, headers=self.spec.headers, timeout=2).status_code < 500:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready in {self.spec.timeout:.0f} s: {self.log_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(self.spec.stop_signal)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(spec: ServerSpec, log_path: Path, *, wait: bool = True) -> ServerProcess:
    """Start ``spec`` with its output in ``log_path``; wait for it to be ready unless told not to
    (a test that watches it refuse to start, or one that starts several and then waits)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = spec.env if spec.env is not None else launch_env()
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [*spec.prefix, sys.executable, "-m", *spec.args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=spec.new_session,
        )
    server = ServerProcess(proc, spec, log_path)
    return server.wait_ready() if wait else server


def import_model(home: Path, model: Path, name: str) -> None:
    """Put ``model`` into the store under ``home`` as ``name``, in a child with that home (the
    store reads its paths from the environment, which this process keeps for its own test)."""
    env = launch_env(home)
    code = (
        "import sys; from localrun.modelstore.store import ModelStore; from localrun.settings import Settings; "
        "ModelStore(Settings()).import_path(sys.argv[1], name=sys.argv[2])"
    )
    subprocess.run([sys.executable, "-c", code, str(model), name], env=env, check=True, cwd=REPO)


def start_in_home(
    home: Path, model: Path, name: str, *, runtime: str = "fake", plan: dict | None = None, **options
) -> ServerProcess:
    """Import ``model`` under a home of its own and start the launcher there: a server a whole
    module can share (the per-test LOCALRUN_HOME is function-scoped)."""
    home.mkdir(parents=True, exist_ok=True)
    import_model(home, model, name)
    return start(launcher(free_port(), home=home, runtime=runtime, options=options, plan=plan), home / "server.log")


# Presets: each returns a spec; the test (or a fixture) starts it.


def launcher(
    port: int,
    *,
    home: Path | None = None,
    runtime: str = "fake",
    options: dict | None = None,
    plan: dict | None = None,
    **launch,
) -> ServerSpec:
    """The test launcher (tests.support.launch) on the given runtime ("" lets the planner pick)."""
    return ServerSpec(launch_args(port, options, plan, **launch), port, env=launch_env(home, runtime=runtime))


def fake_all_caps(port: int, *, home: Path | None = None, **options) -> ServerSpec:
    """The fake runtime declaring every optional capability."""
    return launcher(port, home=home, options={"fake_capabilities": list(ALL), **options})


def llama_tiny(port: int, *, home: Path | None = None, plan: dict | None = None, **options) -> ServerSpec:
    """Real llama.cpp, picked by the planner, for whatever small GGUF the home holds (the tiny one)."""
    spec = launcher(port, home=home, runtime="", plan=plan, options=options)
    spec.timeout = 120.0
    return spec


def gemma(port: int, *, home: Path | None = None, **options) -> ServerSpec:
    """Real llama.cpp on Gemma 3 270M (imported into ``home`` by the caller): slower to load."""
    spec = llama_tiny(port, home=home, **options)
    spec.timeout = 180.0
    return spec


def localrun_serve(port: int, *args: str, home: Path | None = None) -> ServerSpec:
    """``localrun serve`` itself, the real CLI."""
    return ServerSpec(serve_args(port, *args), port, env=launch_env(home))


def mirror(
    home: Path,
    port: int,
    *,
    host: str = "127.0.0.1",
    key: str | None = None,
    upstream: str | None = None,
    prefix: list[str] | None = None,
    connect_host: str | None = None,
    extra_env: dict | None = None,
) -> ServerSpec:
    """``localrun mirror`` serving ``home``'s store (its env holds nothing of the caller's)."""
    args = ["localrun", "--log-level", "INFO", "mirror", "--host", host, "--port", str(port)]
    if key:
        args += ["--key", key]
    if upstream:
        args += ["--upstream", upstream]
    headers = {"Authorization": f"Bearer {key}"} if key else None
    return ServerSpec(
        args,
        port,
        host=connect_host or host,
        env={**launch_env(home, clean=True), **(extra_env or {})},
        prefix=list(prefix or []),
        ready_path="/",
        headers=headers,
        stop_signal=signal.SIGINT,
    )


def upstream_localrun(
    host: str, port: int, *, key: str, home: Path, prefix: list[str] | None = None, options: dict | None = None
) -> ServerSpec:
    """A localrun upstream (the launcher, real llama.cpp on one thread) listening on ``host``."""
    args = launch_args(port, options, {"n_threads": 1}, host=host, api_key=key, log_level="WARNING")
    env = launch_env(home, runtime="", LOCALRUN_SERVER__ALLOWED_HOSTS=f'["{host}"]')
    return ServerSpec(args, port, host=host, env=env, prefix=list(prefix or []), timeout=120.0, new_session=True)


def llama_cpp_server(model: Path, port: int, *, alias: str, interrupt: bool = False) -> ServerSpec:
    """llama-cpp-python's own OpenAI server, as a foreign upstream (``interrupt``: as it ships,
    cancelling a running stream whenever a new request arrives)."""
    args = [
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        alias,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--n_ctx",
        "512",
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
        # By default any new request, even GET /v1/models (localrun's probe for kind openai),
        # cuts off the stream in progress; queue instead, as benchmarks/common.py does.
        "--interrupt_requests",
        "true" if interrupt else "false",
    ]
    return ServerSpec(args, port, ready_path="/v1/models", timeout=120.0, new_session=True)


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
