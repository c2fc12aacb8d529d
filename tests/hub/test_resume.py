"""kill -9 (and Ctrl-C) a pulling process at several points of a 64 MiB download, pull
again: the file is byte-identical and verified, nothing unverified ever sat at the final
path, and each restart asks only for the bytes it lacks."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from localrun.modelstore.pull import pull
from localrun.modelstore.verify import verify
from tests.hub import repos

HUGE = "testorg/Huge-GGUF"
HUGE_FILE = "Huge-Q4_K_M.gguf"
SIZE = 64 * 1024 * 1024
CHUNK = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def _wait_for(partial: Path, at_least: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the pull ended before byte {at_least}: {proc.communicate()}")
        if partial.exists() and partial.stat().st_size >= at_least:
            return
        time.sleep(0.005)
    raise AssertionError(f"no progress to byte {at_least} within {timeout}s")


def _ended(proc: subprocess.Popen, sig: signal.Signals, timeout: float = 30.0) -> None:
    """Wait for the signalled pull to end; if it does not, fail with what it was doing: its state
    and kernel wait channel (a process in uninterruptible disk sleep dies only when the I/O ends)
    and, for a live Python, every thread's stack (pull_child dumps them on SIGUSR1). That is how a
    pull found still reading 60 s after its SIGINT told why: the suite had been started in the
    background without job control, so the child inherited SIGINT ignored."""
    try:
        proc.communicate(timeout=timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    where = []
    for name in ("status", "wchan"):
        try:
            text = Path(f"/proc/{proc.pid}/{name}").read_text()
        except OSError:
            continue
        where.append(next((line for line in text.splitlines() if line.startswith("State:")), text))
    if sig != signal.SIGKILL:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
    proc.kill()
    _, err = proc.communicate()
    stacks = err.decode(errors="replace")[-6000:]
    raise AssertionError(f"the pull outlived {sig.name} by {timeout:.0f}s: {where}\n{stacks}")


@pytest.mark.slow
def test_kill_and_ctrl_c_then_resume(fake_hub, store, hf_cache):
    data = repos.make_gguf(payload=SIZE - 4096, seed=64)
    fake_hub.add_repo(HUGE, {HUGE_FILE: data})
    sha = hashlib.sha256(data).hexdigest()
    fake_hub.faults.throttle_bps = 48 * 1024 * 1024
    blob = hf_cache / "models--testorg--Huge-GGUF" / "blobs" / sha
    partial = Path(str(blob) + ".incomplete")
    for fraction, sig in [(0.1, signal.SIGKILL), (0.45, signal.SIGINT), (0.8, signal.SIGKILL)]:
        had = partial.stat().st_size if partial.exists() else 0
        fake_hub.reset_log()
        # The hub goes silent a little past the point, so the pull cannot finish between our seeing
        # the point and the signal (on a loaded machine the last 20 % at 48 MB/s took less).
        stall = threading.Event()
        fake_hub.faults.drop_at = min(len(data) - 1, int(len(data) * fraction) + 4 * CHUNK)
        fake_hub.faults.drop_times, fake_hub.faults.hold = 1, stall
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.hub.pull_child", HUGE],
            cwd=ROOT,
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            _wait_for(partial, int(len(data) * fraction), proc)
            proc.send_signal(sig)
            _ended(proc, sig)
        finally:
            stall.set()
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode != 0
        assert not blob.exists(), "an unfinished file reached the final path"
        gets = [r for r in fake_hub.requests if r.method == "GET" and r.path.endswith(HUGE_FILE)]
        assert gets and gets[0].range == (f"bytes={had}-" if had else None)
        assert partial.stat().st_size >= had
    kept = partial.stat().st_size
    assert len(data) * 0.8 <= kept < len(data)
    fake_hub.faults.throttle_bps = fake_hub.faults.drop_at = fake_hub.faults.hold = None
    fake_hub.reset_log()
    record = pull(store, HUGE)
    assert [r.range for r in fake_hub.requests if r.method == "GET" and r.path.endswith(HUGE_FILE)] == [
        f"bytes={kept}-"
    ]
    assert fake_hub.bytes_served(HUGE_FILE) <= len(data) - kept + CHUNK
    assert Path(record.path).read_bytes() == data and record.files[0].sha256 == sha
    assert not partial.exists()
    verify(record)
