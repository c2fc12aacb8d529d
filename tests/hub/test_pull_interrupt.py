"""Ctrl-C during ``localrun pull`` says what it kept and how to resume, instead of nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.hub import repos

REPO = "testorg/Stop-GGUF"
FILE = "Stop-Q4_K_M.gguf"
ROOT = Path(__file__).resolve().parents[2]
#: The CLI with Ctrl-C delivered as a terminal delivers it (a suite started in the background of a
#: shell without job control would hand the child SIGINT ignored).
CLI = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); from localrun.cli import main; main()"


def test_ctrl_c_during_pull_says_what_was_kept_and_how_to_resume(fake_hub, hf_cache):  # noqa: ARG001
    data = repos.make_gguf(payload=16 * 1024 * 1024, seed=7)
    fake_hub.add_repo(REPO, {FILE: data})
    fake_hub.faults.throttle_bps = 4 * 1024 * 1024
    stall = threading.Event()
    fake_hub.faults.drop_at, fake_hub.faults.drop_times, fake_hub.faults.hold = len(data) // 2, 1, stall
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "pull", REPO, "-y"],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(p.name.endswith(".incomplete") and p.stat().st_size for p in hf_cache.rglob("*")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        stall.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    line = next(ln for ln in err.splitlines() if ln.startswith("interrupted:"))
    assert "MiB" in line and f"localrun pull {REPO}" in line and "resumes" in line
