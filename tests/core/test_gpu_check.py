"""scripts/gpu-check's steps on a stubbed NVIDIA machine (``nvidia-smi``, ``nvcc``, ``cmake``, ``ninja`` on
PATH): its --dry-run names the card's architecture only, the wheelhouse key, a separate venv, offload of
every layer; without a GPU a real run refuses. The GPU run itself needs a lent device (issue 22)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _stub(folder: Path, name: str, body: str) -> None:
    (folder / name).write_text(f"#!/bin/sh\n{body}\n")
    (folder / name).chmod(0o755)


def _run(tmp_path: Path, *args: str, gpu: bool = True) -> subprocess.CompletedProcess:
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    if gpu:
        _stub(stubs, "nvidia-smi", 'case "$1" in *compute_cap) echo 9.0 ;; *name) echo "NVIDIA H200" ;; esac')
        for tool in ("nvcc", "cmake", "ninja"):
            _stub(stubs, tool, "true")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("LOCALRUN_LLAMA_BACKEND", None)
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu-check"), "--work", str(tmp_path / "w"), "--sdist", str(sdist)]
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=120)


def test_the_dry_run_builds_for_this_card_only_and_offloads_everything(tmp_path):
    out = _run(tmp_path, "--dry-run", "--model", str(tmp_path / "gemma.gguf"))
    assert out.returncode == 0, out.stderr
    log = out.stderr
    assert log.startswith("llama.cpp build: CUDA (NVIDIA H200; nvcc ")
    wheel_step = next(line for line in log.splitlines() if " pip wheel " in line)
    assert "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90'" in wheel_step and "--no-cache-dir" in wheel_step
    assert str(tmp_path / "cache" / "localrun" / "wheels" / "0.3.36-cuda-sm90") in wheel_step
    assert f"-m venv {tmp_path / 'w' / 'venv-cuda'}" in log
    assert "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF" in log
    assert "llama-bench -m " in log and "-ngl 99" in log
    assert log.count("localrun serve --port") == 2  # the CUDA venv, then the CPU one
    assert not (tmp_path / "w").exists()  # a dry run makes nothing


def test_the_wheels_option_keeps_pip_off_the_network(tmp_path):
    out = _run(tmp_path, "--dry-run", "--wheels", str(tmp_path / "wh"))
    assert out.returncode == 0, out.stderr
    pip_steps = [line for line in out.stderr.splitlines() if " pip " in line]
    assert len(pip_steps) == 2 and all(f"--no-index --find-links {tmp_path / 'wh'}" in s for s in pip_steps)


def test_a_machine_without_the_gpu_toolkit_is_refused(tmp_path):
    out = _run(tmp_path, gpu=False)
    assert out.returncode != 0 and "not a CUDA machine with its toolkit" in out.stderr
