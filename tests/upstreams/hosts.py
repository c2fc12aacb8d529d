"""Real upstream processes for the tests: a localrun on its own network host, llama_cpp.server.

:func:`other_host` makes a network namespace joined to this one by a veth pair, with
addresses in 10.232.N.0/30 that exist only inside the two ends this test created. A
server started in it is another host as far as localrun can tell: its own loopback, its
own interface, reached over a link. Where namespaces are not permitted (not root, no
``ip``), it falls back to loopback and says so in the output.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.server.conftest import ServerProcess

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Host:
    address: str  # where the server listens, as seen from here
    prefix: list[str]  # command prefix that runs a program on that host
    isolated: bool  # a real namespace (False: loopback fallback)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@contextlib.contextmanager
def other_host() -> Iterator[Host]:
    """A namespace host at 10.232.N.2 (N from this process id), or loopback where not permitted."""
    n = os.getpid() % 250 + 1
    ns, here, there = f"lrup{os.getpid()}", f"lru{os.getpid() % 100000}a", f"lru{os.getpid() % 100000}b"
    if shutil.which("ip") is None or os.geteuid() != 0:
        print("network namespaces not permitted here (need root and `ip`): upstream runs on loopback instead")
        yield Host("127.0.0.1", [], False)
        return
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", f"10.232.{n}.1/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("-n", ns, "addr", "add", f"10.232.{n}.2/30", "dev", there)
        _ip("-n", ns, "link", "set", there, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        _cleanup(ns, here)
        print(f"network namespace not permitted ({exc}): upstream runs on loopback instead")
        yield Host("127.0.0.1", [], False)
        return
    try:
        print(f"upstream host: network namespace {ns} at 10.232.{n}.2 over veth {here}")
        yield Host(f"10.232.{n}.2", ["ip", "netns", "exec", ns], True)
    finally:
        _cleanup(ns, here)


def _cleanup(ns: str, link: str) -> None:
    for args in (("link", "del", link), ("netns", "del", ns)):
        subprocess.run(["ip", *args], capture_output=True, timeout=20)


class Proc:
    def __init__(self, cmd: list[str], url: str, log_path: Path, env: dict | None = None):
        self.url = url
        self.log_path = log_path
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
        with open(log_path, "wb") as log_file:
            self.proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=full_env, cwd=REPO,
                                         start_new_session=True)

    def wait_ready(self, path: str, timeout: float = 120.0, headers: dict | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited {self.proc.returncode}: {self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(self.url + path, timeout=2, headers=headers).status_code < 500:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"not ready in {timeout:.0f} s: {self.log_path.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        ServerProcess(self.proc, self.url, self.log_path).stop()


def localrun_on(host: Host, port: int, *, key: str, log_path: Path, home: Path, options: dict | None = None) -> Proc:
    """A localrun server (the test launcher, real llama.cpp with one thread) on ``host``;
    ``options``: plan options for its models (``speculative``, …)."""
    cmd = [*host.prefix, sys.executable, "-m", "tests.server.launch", "--host", host.address, "--port", str(port),
           "--api-key", key, "--plan", "n_threads=1", "--log-level", "WARNING"]
    for name, value in (options or {}).items():
        cmd += ["--option", f"{name}={json.dumps(value)}"]
    env = {"LOCALRUN_HOME": str(home), "LOCALRUN_RUNTIME__FORCE": "", "LOCALRUN_SERVER__ALLOWED_HOSTS": f'["{host.address}"]'}
    return Proc(cmd, f"http://{host.address}:{port}", log_path, env)


def llama_cpp_server(model: Path, port: int, *, alias: str, log_path: Path) -> Proc:
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", alias, "--port", str(port),
           "--host", "127.0.0.1", "--n_ctx", "512", "--n_threads", "1", "--n_threads_batch", "1",
           # By default any new request, even GET /v1/models (localrun's probe for kind openai),
           # cuts off the stream in progress; queue instead, as benchmarks/common.py does.
           "--interrupt_requests", "false"]
    return Proc(cmd, f"http://127.0.0.1:{port}", log_path)
