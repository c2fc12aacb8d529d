"""Host A of the mirror tests: a LOCALRUN_HOME whose store holds real pulled and imported
models, and a real ``localrun mirror`` process serving it.

Host A's store is filled the way a user fills one: ``pull`` from the fake hub (a GGUF repo,
and an MLX repo whose config and tokenizer are plain git files beside LFS weights) and
``import`` of the tiny llama GGUF, which the mirror serves as ``local/<name>``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
TINY_NAME = "tiny-llama"
TINY_REPO = "local/tiny-llama"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def home_env(home: Path) -> dict[str, str]:
    """The environment of a host whose everything lives under ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LOCALRUN_", "HUGGING"))}
    env.update(LOCALRUN_HOME=str(home), HF_HOME=str(home / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
               OLLAMA_MODELS=str(home / "ollama-models"), PYTHONPATH=str(ROOT), HF_HUB_DISABLE_PROGRESS_BARS="1")
    return env


def fill_store(home: Path, hub_url: str, tiny_gguf: Path, *, extra_refs: tuple[str, ...] = ()) -> None:
    """Pull two repos from the fake hub and import the tiny GGUF, in a child with A's env."""
    from tests.hub import repos

    env = {**home_env(home), "HF_ENDPOINT": hub_url}
    cmds = [["pull", "-y", f"{repos.GGUF_REPO}:Q4_K_M"], ["pull", "-y", repos.MLX_REPO],
            *(["pull", "-y", r] for r in extra_refs), ["import", str(tiny_gguf), "--name", TINY_NAME]]
    for cmd in cmds:
        subprocess.run([sys.executable, "-m", "localrun", *cmd], env=env, check=True, capture_output=True, timeout=120)


def start_serve(home: Path, port: int, *args: str, prefix: list[str] | None = None, until: str = "serving on",
                timeout: float = 90.0) -> tuple[subprocess.Popen, str]:
    """``localrun serve --port PORT ARGS`` for ``home``, read until stderr says ``until``;
    returns the process and what it printed (the caller stops it with SIGINT)."""
    proc = subprocess.Popen([*(prefix or []), sys.executable, "-m", "localrun", "serve", "--port", str(port), "--no-default-model",
                             *args], env=home_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline, seen = time.monotonic() + timeout, ""
    while time.monotonic() < deadline and until not in seen:
        line = proc.stderr.readline()  # the server prints its ready line promptly, or exits
        if not line:
            break
        seen += line
    return proc, seen


@dataclass
class MirrorProcess:
    proc: subprocess.Popen
    url: str
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start_mirror(home: Path, *, host: str = "127.0.0.1", port: int | None = None, key: str | None = None,
                 upstream: str | None = None, prefix: list[str] | None = None, extra_env: dict | None = None,
                 connect_host: str | None = None) -> MirrorProcess:
    """``localrun mirror`` for ``home`` (optionally inside a namespace: ``prefix``), waited for."""
    port = port or free_port()
    args = [sys.executable, "-m", "localrun", "--log-level", "INFO", "mirror", "--host", host, "--port", str(port)]
    if key:
        args += ["--key", key]
    if upstream:
        args += ["--upstream", upstream]
    home.mkdir(parents=True, exist_ok=True)
    log = home / f"mirror-{port}.log"
    env = {**home_env(home), **(extra_env or {})}
    proc = subprocess.Popen([*(prefix or []), *args], env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    url = f"http://{connect_host or host}:{port}"
    mp = MirrorProcess(proc, url, log)
    if not prefix:
        _wait_ready(mp, key)
    return mp


def _wait_ready(mp: MirrorProcess, key: str | None, timeout: float = 60.0) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mp.proc.poll() is not None:
            raise RuntimeError(f"mirror exited {mp.proc.returncode}: {mp.log_text()[-2000:]}")
        try:
            if httpx.get(mp.url + "/", headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    mp.stop()
    raise RuntimeError(f"mirror did not start: {mp.log_text()[-2000:]}")
