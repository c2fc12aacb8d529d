"""Fixtures for running real coding agents (Claude Code, Codex, opencode) headless against
``localrun launch``.

The agents come from npm, installed by ``scripts/dev setup`` into ``.cache/npm-agents`` (the
project's own folder, never a global install). Each run gets a fresh HOME (agents write
their state there, never into the user's), telemetry off, and — where this machine lets
the test create one — its own network namespace with only a loopback interface, so the
agent and the server it talks to cannot reach anything but 127.0.0.1.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.launch import REPO
from tests.support.servers import ServerProcess, ServerSpec, free_port

AGENTS_BIN = Path(os.environ.get("LOCALRUN_AGENTS_DIR", REPO / ".cache" / "npm-agents")) / "node_modules" / ".bin"
BINARIES = {"claude": "claude", "codex": "codex", "opencode": "opencode"}
_names = itertools.count()


@pytest.fixture(scope="session")
def agents_bin() -> Path:
    if not AGENTS_BIN.is_dir():
        pytest.skip(
            f"the coding agents are not installed in {AGENTS_BIN.parent.parent}: run scripts/dev setup (needs npm)"
        )
    return AGENTS_BIN


def agent_binary(agents_bin: Path, name: str) -> Path:
    path = agents_bin / BINARIES[name]
    if not path.exists():
        pytest.skip(f"{path} is missing: run scripts/dev setup")
    return path


@pytest.fixture
def netns():
    """``ip netns exec NAME`` for a namespace with only loopback up, or [] where none can be made."""
    name = f"lr-agents-{os.getpid()}-{next(_names)}"
    ip = shutil.which("ip")
    made = ip is not None and subprocess.run([ip, "netns", "add", name], capture_output=True).returncode == 0
    if not made:
        yield []
        return
    try:
        subprocess.run([ip, "netns", "exec", name, ip, "link", "set", "lo", "up"], check=True, capture_output=True)
        yield [ip, "netns", "exec", name]
    finally:
        subprocess.run([ip, "netns", "del", name], capture_output=True)


@pytest.fixture
def agent_env(tmp_path, agents_bin, _isolated_home) -> dict[str, str]:
    """The environment of one agent run: its own HOME, the agents on PATH, localrun's test home."""
    from localrun.modelstore.builtins import chat_model_cache

    home = tmp_path / "agent-home"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_", "OPENCODE_", "CLAUDE_"))
    }
    env.update(
        {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "LOCALRUN_CHAT_MODEL_CACHE": str(chat_model_cache()),  # the set-up's SmolLM2, found with the new HOME
            "PATH": f"{agents_bin}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": str(REPO),
            "LOCALRUN_RUNTIME__THREADS": "1",
            "LOCALRUN_LOG_LEVEL": "INFO",
            "NO_COLOR": "1",
            "CI": "1",
        }
    )
    return env


def run_launch(
    prefix: list[str],
    agent: str,
    args: list[str],
    env: dict,
    cwd: Path,
    *,
    timeout: float,
    launch_args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """``localrun launch AGENT [launch_args] -- ARGS`` to its end (stdin closed), output captured."""
    cmd = [*prefix, sys.executable, "-m", "localrun", "launch", agent, *launch_args, "--", *args]
    env = {**env, "PWD": str(cwd)}  # opencode takes its project folder from PWD, not from the process's cwd
    return subprocess.run(
        cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def scripted_server(tmp_path, tiny_gguf_long):
    """``start(prefix, env, script)``: import the tiny model as "tiny", serve it scripted, wait for READY."""
    started: list[ServerProcess] = []

    def start(prefix: list[str], env: dict, script: dict) -> ServerProcess:
        import json

        from localrun.modelstore.store import ModelStore
        from localrun.settings import Settings

        ModelStore(Settings()).import_path(tiny_gguf_long, name="tiny")
        port = 18731 if prefix else free_port()  # a fresh namespace has every port free
        log = tmp_path / f"scripted-{len(started)}.log"
        args = [
            *prefix,
            sys.executable,
            "-m",
            "tests.agents.scripted",
            "--port",
            str(port),
            "--plan",
            "n_ctx=65536",
            "--option",
            f"script_calls={json.dumps(script)}",
        ]
        proc = subprocess.Popen(
            args,
            env={**env, "LOCALRUN_RUNTIME__FORCE": "scripted"},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=open(log, "wb"),
            text=True,
        )
        server = ServerProcess(proc, ServerSpec(args, port), log)
        server.port = port
        started.append(server)
        deadline = time.monotonic() + 120
        line = proc.stdout.readline()  # "READY <url>" once listening, "" if it died
        if not line.startswith("READY") or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"the scripted server did not start: {line!r} {server.log_text()[-2000:]}")
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def tiny_gguf_long(tmp_path_factory) -> Path:
    """The tiny model with a trained context long enough for an agent's whole first request."""
    from tests.factories import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny-agents") / "tiny-agents.gguf", n_ctx_train=65536)
