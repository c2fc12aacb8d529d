"""The air-gapped install, for real: a bundle with a wheelhouse made here (this step uses the
package index), then, in a network namespace holding only ``lo``, a fresh venv installs
localrun from the wheelhouse alone, imports the bundle and answers with `localrun run`.

Where ``ip netns`` is not permitted the same steps run without the namespace, and the test
says so in its output (a warning), rather than skipping."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.conftest import needs_llama

LOCALRUN = str(Path(sys.executable).with_name("localrun"))


def _namespace(name: str) -> bool:
    try:
        made = subprocess.run(["ip", "netns", "add", name], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if made.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True, timeout=30)
    return True


@pytest.mark.slow
@pytest.mark.gemma
@pytest.mark.llama
@needs_llama
def test_install_import_and_run_with_no_network(source, gemma_gguf, tmp_path):
    source.store().import_path(gemma_gguf, name="gemma3-270m")
    bundle = tmp_path / "bundle"
    # --allow-native-llama: the air-gapped "box" is this machine, so pip's cached (native) wheel runs there.
    made = subprocess.run(
        [LOCALRUN, "bundle", "export", "gemma3-270m", "-o", str(bundle), "--with-wheels", "--allow-native-llama"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert made.returncode == 0, made.stderr
    wheels = bundle / "wheels"
    assert any(p.name.startswith("llama_cpp_python-") for p in wheels.iterdir())
    assert (wheels / "requirements.txt").read_text().count("--hash=sha256:") == len(list(wheels.glob("*.whl")))

    box = tmp_path / "box"
    venv = box / "venv"
    box.mkdir()
    steps = [
        f"{shlex.quote(sys._base_executable)} -m venv {venv}",
        f"{venv}/bin/pip install -q --no-index --find-links {wheels} --require-hashes -r {wheels}/requirements.txt",
        f"{venv}/bin/localrun bundle import {bundle}",
        f"{venv}/bin/localrun ls",
        f"{venv}/bin/localrun run gemma3-270m 'The capital of France is' --max-tokens 4 --threads 2",
    ]
    # Inside the namespace: any interface but lo fails the test before anything is installed.
    script = "set -e\nif ip -o link | grep -v ' lo:'; then exit 99; fi\n" + "\n".join(steps)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(box),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "LOCALRUN_HOME": str(box / "localrun"),
        "HF_HOME": str(box / "hf"),
        "LANG": "C.UTF-8",
    }
    ns = f"lr-airgap-{os.getpid()}"
    isolated = _namespace(ns)
    if not isolated:
        warnings.warn(
            "ip netns is not permitted here: the air-gap test ran WITHOUT a network namespace "
            "(pip still had --no-index and no config)",
            stacklevel=1,
        )
    cmd = (["ip", "netns", "exec", ns] if isolated else []) + [
        "bash",
        "-c",
        script if isolated else "\n".join(["set -e", *steps]),
    ]
    try:
        # cwd: the box, which has no source tree (`python -m` would import ./localrun from a checkout)
        run = subprocess.run(cmd, env=env, cwd=box, capture_output=True, text=True, timeout=900)
    finally:
        if isolated:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    assert run.returncode == 0, (run.returncode, run.stdout[-3000:], run.stderr[-3000:])
    assert "imported gemma3-270m" in run.stdout and "bundle" in run.stdout
    assert "4 tokens" in run.stderr + run.stdout
