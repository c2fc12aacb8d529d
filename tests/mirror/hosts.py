"""Host A of the mirror tests: a LOCALRUN_HOME whose store holds real pulled and imported
models, and a real ``localrun mirror`` process serving it.

Host A's store is filled the way a user fills one: ``pull`` from the fake hub (a GGUF repo,
and an MLX repo whose config and tokenizer are plain git files beside LFS weights) and
``import`` of the tiny llama GGUF, which the mirror serves as ``local/<name>``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.support import servers
from tests.support.launch import launch_env, serve_args

TINY_NAME = "tiny-llama"
TINY_REPO = "local/tiny-llama"


def home_env(home: Path) -> dict[str, str]:
    """The environment of a host whose everything lives under ``home``."""
    return launch_env(home, clean=True)


def fill_store(home: Path, hub_url: str, tiny_gguf: Path, *, extra_refs: tuple[str, ...] = ()) -> None:
    """Pull two repos from the fake hub and import the tiny GGUF, in a child with A's env."""
    from tests.hub import repos

    env = {**home_env(home), "HF_ENDPOINT": hub_url}
    cmds = [
        ["pull", "-y", f"{repos.GGUF_REPO}:Q4_K_M"],
        ["pull", "-y", repos.MLX_REPO],
        *(["pull", "-y", r] for r in extra_refs),
        ["import", str(tiny_gguf), "--name", TINY_NAME],
    ]
    for cmd in cmds:
        subprocess.run([sys.executable, "-m", "localrun", *cmd], env=env, check=True, capture_output=True, timeout=120)


def start_serve(
    home: Path, port: int, *args: str, prefix: list[str] | None = None, until: str = "serving on", timeout: float = 90.0
) -> tuple[subprocess.Popen, str]:
    """``localrun serve --port PORT ARGS`` for ``home``, read until stderr says ``until``;
    returns the process and what it printed (the caller stops it with SIGINT)."""
    proc = subprocess.Popen(
        [*(prefix or []), sys.executable, "-m", *serve_args(port, *args)],
        env=home_env(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline, seen = time.monotonic() + timeout, ""
    while time.monotonic() < deadline and until not in seen:
        line = proc.stderr.readline()  # the server prints its ready line promptly, or exits
        if not line:
            break
        seen += line
    return proc, seen


def start_mirror(
    home: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    key: str | None = None,
    upstream: str | None = None,
    prefix: list[str] | None = None,
    extra_env: dict | None = None,
    connect_host: str | None = None,
) -> servers.ServerProcess:
    """``localrun mirror`` for ``home``; waited for unless it runs inside a namespace (``prefix``),
    where only the caller knows how to reach it."""
    port = port or servers.free_port()
    home.mkdir(parents=True, exist_ok=True)
    spec = servers.mirror(
        home, port, host=host, key=key, upstream=upstream, prefix=prefix, connect_host=connect_host, extra_env=extra_env
    )
    return servers.start(spec, home / f"mirror-{port}.log", wait=not prefix)
