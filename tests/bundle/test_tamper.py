"""A bundle changed in place on the disk it was exported on, its mtime put back.

The seal lets a same-disk import skip hashing. It used to be (device, inode, size, mtime);
``os.utime`` (or ``cp -p``, ``rsync -t``) restores an mtime, so a byte flipped in place
imported as verified with 0 bytes hashed. The seal now carries the ctime, which the kernel
sets on every write and ``utime`` and which no unprivileged call can put back.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localrun.modelstore.bundle.export import export_bundle
from localrun.modelstore.bundle.importer import import_bundle
from localrun.modelstore.bundle.lock import BundleError


@pytest.fixture
def bundle_dir(source, tiny_model, tmp_path) -> Path:
    export_bundle(source.store(), ["tiny"], tmp_path / "b")
    return tmp_path / "b"


def _flip_in_place_keeping_mtime(path: Path, at: int = 1000) -> None:
    st = path.stat()
    with open(path, "r+b") as f:  # the same inode: device, inode and size stay as sealed
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns) == (
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )


def test_same_disk_tamper_with_restored_mtime_is_refused(target, bundle_dir):
    blob = next(bundle_dir.glob("hub/models--*/blobs/*"))
    _flip_in_place_keeping_mtime(blob)
    store = target.store()
    before = target.state()
    with pytest.raises(BundleError) as err:
        import_bundle(store, bundle_dir)
    text = str(err.value)
    assert blob.name in text and "does not match the lock" in text and "sha256" in text, text
    assert "altered or damaged after export" in text, text
    assert target.state() == before and store.list() == []  # nothing registered, no blob, no partial
    assert not list(target.hf_cache.glob("models--*/blobs/*"))


def test_untouched_same_disk_bundle_still_imports_without_hashing(target, bundle_dir):
    """The shortcut the seal exists for still holds: an untouched inode is linked, not read."""
    res = import_bundle(target.store(), bundle_dir)
    assert (res.linked, res.bytes_hashed) == (1, 0)


def test_a_seal_without_ctime_is_not_trusted(target, bundle_dir):
    """A seal written before the ctime was recorded cannot vouch for anything: hash."""
    import json

    from localrun.modelstore.bundle.source import SEAL_NAME

    seal_path = bundle_dir / SEAL_NAME
    doc = json.loads(seal_path.read_text())
    doc["files"] = {rel: key[:4] for rel, key in doc["files"].items()}
    seal_path.write_text(json.dumps(doc))
    res = import_bundle(target.store(), bundle_dir)
    assert res.bytes_hashed == sum(r.size for r in res.records)
