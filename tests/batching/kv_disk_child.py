"""A child process for the disk tier's tests: writes entries into a shared root, or writes one
large blob slowly so the parent can SIGKILL it mid-write.

    python kv_disk_child.py many ROOT MODEL COUNT BUDGET   # COUNT entries, then flush
    python kv_disk_child.py slow ROOT MODEL NBYTES         # one blob, a chunk every 50 ms; never ends
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

from localrun.runtimes.llamacpp.cache import kv_disk, kv_file


def key(model: str) -> kv_disk.StateKey:
    sha = hashlib.sha256(model.encode()).hexdigest()
    return kv_disk.StateKey(sha, "test-runtime", (("type_k", "f16"), ("n_ctx_seq", "512")), model_name=model)


def blob_for(tokens: tuple[int, ...], nbytes: int) -> bytes:
    """A blob whose content follows from its tokens, so a reader can tell a right one from a wrong one."""
    seed = hashlib.sha256(kv_file.token_bytes(tokens)).digest()
    return (seed * (nbytes // len(seed) + 1))[:nbytes]


def many(root: Path, model: str, count: int, budget: int) -> None:
    tier = kv_disk.DiskTier(root, key(model), budget_bytes=budget)
    for i in range(count):
        tokens = (7, os.getpid() % 1000, i, *range(i % 5))
        while not tier.put(tokens, blob_for(tokens, 20_000 + 37 * i)):
            tier.flush()  # the queue is full: wait for the writer, then try again
    tier.close()


def slow(root: Path, model: str, nbytes: int) -> None:
    real_write = kv_disk._write_all

    def crawl(fd: int, data) -> None:
        real_write(fd, data)
        print("writing", flush=True)
        time.sleep(0.05)

    kv_disk._write_all = crawl
    kv_file.CHUNK = 64 << 10
    tier = kv_disk.DiskTier(root, key(model), budget_bytes=4 * nbytes)
    tier.put(tuple(range(100)), blob_for(tuple(range(100)), nbytes))
    tier.flush(timeout_s=3600)


if __name__ == "__main__":
    mode, root, model = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if mode == "many":
        many(root, model, int(sys.argv[4]), int(sys.argv[5]))
    else:
        slow(root, model, int(sys.argv[4]))
