"""Fixtures for the Responses API tests: real server processes shared by a module.

A server process takes a few seconds to start on a loaded machine, and the Responses
tests ask one server many questions, so a module starts each kind once: under its own
LOCALRUN_HOME (the per-test one is function-scoped), stopped when the module ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.server.conftest import REPO, ServerProcess, free_port, launch_args

ALL = ("tools", "json_schema", "logprobs", "embeddings")


def start_server(home: Path, model: Path, name: str, *, runtime: str = "fake", plan: dict | None = None,
                 **options) -> ServerProcess:
    """Import ``model`` under ``home`` and start ``tests.server.launch`` there; ready once it says READY."""
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LOCALRUN_HOME": str(home), "HF_HOME": str(home / "hf"), "LOCALRUN_RUNTIME__FORCE": runtime,
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ModelStore(Settings(data_dir=home / "data", cache_dir=home / "cache")).import_path(model, name=name)
    port = free_port()
    args = [sys.executable, "-m", *launch_args(port, options, plan)]
    log_path = home / "server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log_file, env=env, cwd=REPO, text=True)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
    line = proc.stdout.readline()  # the launcher prints "READY <url>" once listening; "" when it died
    if not line.startswith("READY"):
        server.stop()
        raise RuntimeError(f"server did not start ({proc.poll()}): {server.log_text()[-2000:]}")
    return server


def client_for(server: ServerProcess, timeout: float = 60) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=timeout)


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory, tiny_gguf):
    """A real server on the fake runtime declaring every optional capability."""
    server = start_server(tmp_path_factory.mktemp("resp-home"), tiny_gguf, "tiny", fake_capabilities=list(ALL))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory, tiny_gguf):
    """A real server on the fake runtime declaring no optional capability."""
    server = start_server(tmp_path_factory.mktemp("resp-bare"), tiny_gguf, "tiny", fake_capabilities=[])
    yield server
    server.stop()


@pytest.fixture
def oai(fake_server):
    with client_for(fake_server) as client:
        yield client
