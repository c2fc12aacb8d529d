"""llama.cpp's own ``-hf`` downloader as a real client of ``localrun mirror``: refs → tree →
HEAD/GET resolve, with only HF_ENDPOINT set, then the model it fetched answers.

Needs a llama-server binary: ``scripts/build-llama-server`` builds it once (~8 min on 2
cores) from the llama.cpp the llama-cpp-python sdist vendors and caches it; or point
LOCALRUN_LLAMA_SERVER at one. Marked ``llamacpp_bin``; without the binary it is skipped and
says how to get it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.mirror.hosts import TINY_REPO, home_env
from tests.support.servers import free_port


def _llama_server() -> Path | None:
    explicit = os.environ.get("LOCALRUN_LLAMA_SERVER")
    if explicit:
        return Path(explicit)
    try:
        import importlib.metadata as md

        version = md.version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - no llama-cpp-python: no cached build either
        return None
    cache = Path(os.environ.get("LOCALRUN_TEST_CACHE", Path.home() / ".cache" / "localrun-test"))
    path = cache / f"llama.cpp-{version}" / "build" / "bin" / "llama-server"
    return path if path.is_file() else (Path(shutil.which("llama-server")) if shutil.which("llama-server") else None)


BINARY = _llama_server()
pytestmark = [
    pytest.mark.llamacpp_bin,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        BINARY is None or not os.access(BINARY, os.X_OK),
        reason="no llama-server binary: run scripts/build-llama-server (cached after the first "
        "~8 min build) or set LOCALRUN_LLAMA_SERVER",
    ),
]


def test_llama_server_dash_hf_pulls_from_the_mirror_and_answers(mirror, tmp_path, tiny_gguf):
    binary = BINARY
    port, cache = free_port(), tmp_path / "llama-cache"
    env = {**home_env(tmp_path / "b"), "HF_ENDPOINT": mirror.url, "LLAMA_CACHE": str(cache)}
    log = tmp_path / "llama-server.log"
    proc = subprocess.Popen(
        [
            str(binary),
            "-hf",
            TINY_REPO,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "-t",
            "1",
            "-c",
            "256",
            "--no-webui",
        ],
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"llama-server never became healthy: {log.read_text(errors='replace')[-3000:]}")
        got = httpx.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "Hello", "n_predict": 4}, timeout=60)
        assert got.status_code == 200 and "content" in got.json()
        fetched = [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size == tiny_gguf.stat().st_size]
        assert (
            fetched
            and hashlib.sha256(fetched[0].read_bytes()).hexdigest()
            == hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
