"""The portable llama.cpp build, for real: the wheelhouse's GGML_BACKEND_DL wheel (built here when it
is missing: ~1 hour on 2 shared cores, once; then kept in ~/.cache/localrun/wheels/<v>-cpu-portable-*),
carried in a bundle, installed in a fresh venv inside a network namespace holding only ``lo``, where
ggml picks a CPU variant at run time (never the AMX one) and Gemma 3 270M answers."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from localrun.modelstore.bundle import wheels
from tests.bundle.test_airgap import LOCALRUN, _namespace
from tests.conftest import needs_llama

CHECK = (
    "import llama_cpp; from localrun.runtimes.llamacpp import build_info as b; b.load_backends(llama_cpp); "
    "print(b.build_backend(llama_cpp), b.is_dynamic(llama_cpp), llama_cpp.llama_print_system_info().decode())"
)


@pytest.fixture(scope="session")
def portable_wheel() -> Path:
    from importlib import metadata

    version = metadata.version("llama-cpp-python")
    kept = sorted(wheels.portable_wheelhouse(version).glob(f"llama_cpp_python-{version}-*.whl"))
    if not kept and os.environ.get("LOCALRUN_BUILD_PORTABLE") != "1":
        # A cold build is over an hour on 2 cores: more than CI's whole budget. It is built once,
        # on purpose (this test with LOCALRUN_BUILD_PORTABLE=1, or `bundle export --with-wheels
        # --build-portable-llama`), then kept; from then on this test runs in every suite.
        pytest.skip("no portable llama.cpp wheel kept yet: run with LOCALRUN_BUILD_PORTABLE=1 to build it once")
    with tempfile.TemporaryDirectory(prefix="portable-llama-") as tmp:
        return wheels.build_portable_wheel(version, Path(tmp))


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)  # a cold run builds the wheel (over an hour on 2 cores); a warm one: minutes
@pytest.mark.gemma
@pytest.mark.llama
@needs_llama
def test_the_portable_wheel_installs_offline_and_answers(source, gemma_gguf, portable_wheel, tmp_path):
    variants = wheels.portable_variants(portable_wheel)
    assert "haswell" in variants and "sapphirerapids" not in variants
    source.store().import_path(gemma_gguf, name="gemma3-270m")
    bundle = tmp_path / "bundle"
    made = subprocess.run(
        [LOCALRUN, "bundle", "export", "gemma3-270m", "-o", str(bundle), "--with-wheels"]
        + ["--llama-wheel", str(portable_wheel)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert made.returncode == 0, made.stderr
    box = tmp_path / "box"
    venv = box / "venv"
    box.mkdir()
    w = bundle / "wheels"
    steps = [
        f"{shlex.quote(sys._base_executable)} -m venv {venv}",
        f"{venv}/bin/pip install -q --no-index --find-links {w} --require-hashes -r {w}/requirements.txt",
        f"{venv}/bin/python -c {shlex.quote(CHECK)}",
        f"{venv}/bin/localrun bundle import {bundle}",
        f"{venv}/bin/localrun run gemma3-270m 'The capital of France is' --max-tokens 4 --threads 2",
    ]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(box), "PIP_CONFIG_FILE": os.devnull, "LANG": "C.UTF-8"}
    env |= {"LOCALRUN_HOME": str(box / "localrun"), "HF_HOME": str(box / "hf"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    ns = f"lr-portable-{os.getpid()}"
    isolated = _namespace(ns)
    script = "set -e\n" + ("if ip -o link | grep -v ' lo:'; then exit 99; fi\n" if isolated else "") + "\n".join(steps)
    cmd = (["ip", "netns", "exec", ns] if isolated else []) + ["bash", "-c", script]
    try:
        run = subprocess.run(cmd, env=env, cwd=box, capture_output=True, text=True, timeout=900)
    finally:
        if isolated:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    assert run.returncode == 0, (run.returncode, run.stdout[-3000:], run.stderr[-3000:])
    assert run.stdout.startswith("cpu True") and "AVX2 = 1" in run.stdout and "AMX_INT8 = 1" not in run.stdout
    assert "4 tokens" in run.stderr + run.stdout
