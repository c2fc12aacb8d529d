"""Pull throughput from a loopback fake hub, against a plain httpx streaming copy of the same bytes.

    python benchmarks/bench_pull.py [--size-mib 256] [--rounds 3]

The hub runs in its own process so its GIL does not slow the client. Both sides write to a
file in the same folder; the pull also lists the repo, hashes while streaming (sha256),
fsyncs, renames into the HF cache layout and registers the model. Best of N rounds each.
Target: pull ÷ plain ≥ 0.8.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REPO = "bench/Big-GGUF"
FILE = "Big-Q4_K_M.gguf"


def _serve(size: int, ready) -> None:
    from tests.hub.fakehub import FakeHub
    from tests.hub.repos import make_gguf

    hub = FakeHub()
    hub.add_repo(REPO, {FILE: make_gguf(payload=size, seed=1)})
    hub.start()
    ready.send((hub.url, hub.file(REPO, FILE).sha256, len(hub.file(REPO, FILE).data), hub.repos[REPO].refs["main"]))
    ready.recv()  # block until told to stop
    hub.stop()


def plain_copy(url: str, dest: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for a bare streaming copy to a file."""
    import httpx

    began, cpu = time.perf_counter(), time.process_time()
    with (
        httpx.Client() as client,
        client.stream("GET", url, headers={"Accept-Encoding": "identity"}) as resp,
        open(dest, "wb") as f,
    ):
        resp.raise_for_status()
        for chunk in resp.iter_raw():
            f.write(chunk)
    return time.perf_counter() - began, time.process_time() - cpu


def localrun_pull() -> tuple[float, float]:
    """(wall seconds, CPU seconds) for a whole pull: list, download, verify, fsync, register."""
    from localrun.modelstore.pull import pull
    from localrun.modelstore.store import ModelStore
    from localrun.settings import load_settings

    store = ModelStore(load_settings())
    began, cpu = time.perf_counter(), time.process_time()
    pull(store, REPO)
    return time.perf_counter() - began, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    parent, child = mp.Pipe()
    server = mp.get_context("fork").Process(target=_serve, args=(args.size_mib * 1024 * 1024, child), daemon=True)
    server.start()
    url, sha, size, commit = parent.recv()
    work = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    os.environ.update(
        HF_ENDPOINT=url, HF_HOME=str(work / "hf"), LOCALRUN_HOME=str(work / "home"), HF_HUB_DISABLE_TELEMETRY="1"
    )
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
        os.environ.pop(var, None)
    file_url = f"{url}/{REPO}/resolve/{commit}/{FILE}"
    plain, pulled = [], []
    try:
        for _ in range(args.rounds):
            plain.append(plain_copy(file_url, work / "plain.bin"))
            (work / "plain.bin").unlink()
            shutil.rmtree(work / "hf", ignore_errors=True)
            shutil.rmtree(work / "home", ignore_errors=True)
            pulled.append(localrun_pull())
    finally:
        parent.send("stop")
        server.join(5)
        shutil.rmtree(work, ignore_errors=True)
    mib = size / (1024 * 1024)
    (best_plain, plain_cpu), (best_pull, pull_cpu) = min(plain), min(pulled)
    print(f"file: {mib:.0f} MiB, best of {args.rounds}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"plain httpx copy : {mib / best_plain:8.1f} MiB/s  ({best_plain:.3f} s wall, {plain_cpu:.3f} s CPU)")
    print(f"localrun pull    : {mib / best_pull:8.1f} MiB/s  ({best_pull:.3f} s wall, {pull_cpu:.3f} s CPU)")
    print(f"ratio pull/plain : {best_plain / best_pull:8.2f}  (target >= 0.8)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
