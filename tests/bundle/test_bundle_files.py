"""A bundle's small files are read only when they are regular files, and only as far as their
bound: a FIFO in place of ``refs/main`` blocked ``bundle verify`` for good, and a lock was read
whole before its size was checked (a 10 KB sparse tar whose lock claimed 10 GB OOM-killed
``bundle verify`` in 14 s). Memory is measured with tracemalloc while a lock claims 64 MiB."""

from __future__ import annotations

import os
import tarfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from localrun.modelstore.bundle.importer import verify_bundle
from localrun.modelstore.bundle.lock import LOCK_NAME, MAX_LOCK_BYTES, BundleError
from tests.bundle.test_bad_bundles import bundle_dir, bundle_tar  # noqa: F401  (fixtures)

CLAIM = 4 * MAX_LOCK_BYTES  # 64 MiB: enough to see, little enough to survive the bug


def _peak_while(fn) -> tuple[float, BaseException | None]:
    tracemalloc.start()
    try:
        fn()
        err = None
    except BaseException as exc:  # the refusal is asserted by the caller
        err = exc
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, err


def test_a_fifo_in_place_of_refs_main_is_refused_without_blocking(bundle_dir):  # noqa: F811
    ref = next(bundle_dir.glob("hub/models--*/refs/main"))
    ref.unlink()
    os.mkfifo(ref)

    def release() -> None:  # so the bug fails the test on its clock instead of hanging the suite
        time.sleep(8)
        try:
            os.close(os.open(ref, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    threading.Thread(target=release, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(BundleError, match="refs/main.*not a regular file"):
        verify_bundle(bundle_dir)
    assert time.monotonic() - started < 5


def test_a_sparse_lock_in_a_folder_is_refused_before_it_is_read(bundle_dir):  # noqa: F811
    with open(bundle_dir / LOCK_NAME, "r+b") as f:
        f.truncate(CLAIM)  # a hole: 64 MiB claimed, nothing on disk
    peak, err = _peak_while(lambda: verify_bundle(bundle_dir))
    assert isinstance(err, BundleError) and "more than" in str(err), err
    assert peak < MAX_LOCK_BYTES // 4, f"{peak:,} bytes allocated to refuse it"


def test_a_tar_whose_lock_claims_more_than_a_lock_may_be_is_refused_before_it_is_read(
    bundle_tar,  # noqa: F811
    tmp_path: Path,
):
    with tarfile.open(bundle_tar) as tar:
        lock = tar.getmembers()[0]
    assert lock.name == LOCK_NAME
    lock.size = CLAIM
    bad = tmp_path / "sparse.tar"
    with open(bad, "wb") as f:
        f.write(lock.tobuf(format=tarfile.PAX_FORMAT))
        f.truncate(f.tell() + CLAIM + 1024)  # the member's bytes are a hole
    peak, err = _peak_while(lambda: verify_bundle(bad))
    assert isinstance(err, BundleError) and "more than a lock may be" in str(err), err
    assert peak < MAX_LOCK_BYTES // 4, f"{peak:,} bytes allocated to refuse it"
