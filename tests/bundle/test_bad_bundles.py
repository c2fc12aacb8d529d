"""Every bad bundle is refused with an error naming the file and the problem, and leaves
nothing registered and no blob behind on the importing machine."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from localrun.errors import InvalidModelFile
from localrun.modelstore.bundle.export import export_bundle
from localrun.modelstore.bundle.importer import import_bundle, verify_bundle
from localrun.modelstore.bundle.lock import LOCK_NAME, BundleError

HOSTILE_PATHS = [
    "../x.gguf",
    "/abs.gguf",
    "C:x.gguf",
    "c:/x.gguf",
    "a/../../b.gguf",
    "..\\x.gguf",
    "\\\\host\\x.gguf",
    "x\x00.gguf",
    "~/x.gguf",
    "con.gguf",
    "\uff0e\uff0e/x.gguf",
]


@pytest.fixture
def bundle_dir(source, tiny_model, tmp_path) -> Path:
    export_bundle(source.store(), ["tiny"], tmp_path / "b")
    return tmp_path / "b"


@pytest.fixture
def bundle_tar(source, tiny_model, tmp_path) -> Path:
    export_bundle(source.store(), ["tiny"], tmp_path / "b.tar")
    return tmp_path / "b.tar"


def blob_of(bundle: Path) -> Path:
    return next(bundle.glob("hub/models--*/blobs/*"))


def edit_lock(bundle: Path, edit) -> None:
    doc = json.loads((bundle / LOCK_NAME).read_text())
    edit(doc)
    (bundle / LOCK_NAME).write_text(json.dumps(doc))


def read_tar(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as tar:
        return [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar.getmembers()]


def write_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if info.isreg():
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def refused(target, bundle: Path, *needles: str, rehash: bool = False) -> BundleError:
    store = target.store()
    with pytest.raises(BundleError) as info:
        import_bundle(store, bundle, rehash=rehash)
    text = str(info.value)
    for needle in needles:
        assert needle in text, text
    assert store.list() == []
    assert not list(target.hf_cache.glob("models--*/blobs/*")) and not list(
        target.hf_cache.glob("models--*/snapshots/*")
    )
    return info.value


@pytest.mark.parametrize("bad", HOSTILE_PATHS)
def test_lock_path_that_escapes(bad, target, bundle_dir):
    def edit(doc):
        doc["models"][0]["files"][0]["path"] = doc["models"][0]["primary"] = bad

    edit_lock(bundle_dir, edit)
    refused(target, bundle_dir, "unsafe file name")
    with pytest.raises(BundleError):
        verify_bundle(bundle_dir)


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("name", "../evil", "invalid model name"),
        ("repo", "../../etc", "invalid hub repo id"),
        ("revision", "../../x", "revision"),
        ("commit", "not-a-commit", "commit"),
    ],
)
def test_lock_model_fields_that_are_unsafe(field, value, needle, target, bundle_dir):
    edit_lock(bundle_dir, lambda doc: doc["models"][0].__setitem__(field, value))
    refused(target, bundle_dir, needle)


def test_symlink_pointing_out_of_the_bundle(target, bundle_dir):
    link = next(bundle_dir.glob("hub/models--*/snapshots/*/*"))
    link.unlink()
    os.symlink("/etc/passwd", link)
    refused(target, bundle_dir, "pointing out of the bundle", link.name)
    link.unlink()
    os.symlink("../../../../../../etc/passwd", link)
    refused(target, bundle_dir, "pointing out of the bundle")


def test_hub_folder_replaced_by_a_symlink(target, bundle_dir, tmp_path):
    (bundle_dir / "hub").rename(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", bundle_dir / "hub")
    refused(target, bundle_dir, "symlink where a folder belongs")


def test_blob_truncated(target, bundle_dir):
    blob = blob_of(bundle_dir)
    os.truncate(blob, blob.stat().st_size - 100)
    refused(target, bundle_dir, blob.name, "the lock says")


def test_file_flipped_on_disk_after_export(target, bundle_dir):
    blob = blob_of(bundle_dir)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="sha256"):
        verify_bundle(bundle_dir)
    refused(target, bundle_dir, blob.name, "does not match the lock", "sha256")


def test_flipped_byte_with_mtime_put_back_is_caught_by_rehash(target, bundle_dir):
    """The seal trusts an untouched inode; --rehash (and `verify`) trust nothing."""
    blob = blob_of(bundle_dir)
    st = blob.stat()
    with open(blob, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    refused(target, bundle_dir, "does not match the lock", rehash=True)
    with pytest.raises(BundleError, match="sha256"):
        verify_bundle(bundle_dir)


def test_flipped_byte_in_a_tar(target, bundle_tar, tmp_path):
    members = read_tar(bundle_tar)
    info, data = next((m, d) for m, d in members if "/blobs/" in m.name)
    flipped = bytearray(data)
    flipped[-1] ^= 0x55
    members = [(m, bytes(flipped) if m is info else d) for m, d in members]
    bad = write_tar(tmp_path / "bad.tar", members)
    with pytest.raises(BundleError, match="sha256"):
        verify_bundle(bad)
    refused(target, bad, Path(info.name).name, "sha256")


def test_lock_names_a_file_the_folder_lacks(target, bundle_dir):
    blob = blob_of(bundle_dir)
    blob.unlink()
    refused(target, bundle_dir, blob.name, "bundle lacks it")


def test_lock_names_a_file_the_tar_lacks(target, bundle_tar, tmp_path):
    members = [(m, d) for m, d in read_tar(bundle_tar) if "/blobs/" not in m.name]
    refused(target, write_tar(tmp_path / "bad.tar", members), "bundle lacks it")


def test_unknown_schema_version(target, bundle_dir):
    edit_lock(bundle_dir, lambda doc: doc.__setitem__("schema_version", 2))
    refused(target, bundle_dir, "unknown schema version 2")


def test_duplicate_file_entry(target, bundle_dir):
    edit_lock(bundle_dir, lambda doc: doc["models"][0]["files"].append(dict(doc["models"][0]["files"][0])))
    refused(target, bundle_dir, "duplicate entry")


def test_duplicate_model_entry(target, bundle_dir):
    edit_lock(bundle_dir, lambda doc: doc["models"].append(dict(doc["models"][0])))
    refused(target, bundle_dir, "duplicate entry", "tiny")


def test_duplicate_tar_member(target, bundle_tar, tmp_path):
    members = read_tar(bundle_tar)
    blob = next((m, d) for m, d in members if "/blobs/" in m.name)
    refused(target, write_tar(tmp_path / "bad.tar", members + [blob]), "duplicate entry")


@pytest.mark.parametrize("cut", ["lock", "header", "middle", "last-entry"])
def test_truncated_tar(cut, target, bundle_tar, tmp_path):
    data = bundle_tar.read_bytes()
    with tarfile.open(bundle_tar) as tar:
        last = tar.getmembers()[-1].offset  # cut exactly between two entries: tarfile sees no error
    at = {"lock": 700, "header": 512 * 5 + 100, "middle": len(data) // 2, "last-entry": last}[cut]
    bad = tmp_path / "cut.tar"
    bad.write_bytes(data[:at])
    store = target.store()
    with pytest.raises(BundleError) as info:
        import_bundle(store, bad)
    assert any(w in str(info.value) for w in ("truncated", "lacks", "not a readable tar")), str(info.value)
    assert store.list() == [] and not list(target.hf_cache.glob("models--*/blobs/*"))


def test_tar_cut_only_in_its_end_padding_still_imports(target, bundle_tar, tmp_path):
    """Every entry is whole: nothing is lost, so nothing is refused."""
    with tarfile.open(bundle_tar) as tar:
        end = tar.getmembers()[-1].offset_data + 512
    (tmp_path / "cut.tar").write_bytes(bundle_tar.read_bytes()[:end])
    assert [r.name for r in import_bundle(target.store(), tmp_path / "cut.tar").records] == ["tiny"]


@pytest.mark.parametrize("name", ["../evil", "/abs/evil", "hub/../../evil", "C:evil"])
def test_tar_member_that_escapes(name, target, bundle_tar, tmp_path):
    members = read_tar(bundle_tar)
    evil = tarfile.TarInfo(name)
    refused(target, write_tar(tmp_path / "bad.tar", members[:1] + [(evil, b"x")] + members[1:]), "unsafe entry name")
    assert not (tmp_path / "evil").exists() and not Path("/abs/evil").exists()


@pytest.mark.parametrize("kind", [tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE])
def test_tar_member_of_a_forbidden_kind(kind, target, bundle_tar, tmp_path):
    members = read_tar(bundle_tar)
    odd = tarfile.TarInfo("hub/odd")
    odd.type, odd.linkname = kind, "localrun.lock.json"
    refused(target, write_tar(tmp_path / "bad.tar", members + [(odd, b"")]), "hub/odd", "not a file")


def test_tar_symlink_pointing_out(target, bundle_tar, tmp_path):
    members = read_tar(bundle_tar)
    for m, _ in members:
        if m.issym():
            m.linkname = "/etc/passwd"
    refused(target, write_tar(tmp_path / "bad.tar", members), "pointing out of the bundle")


def test_tar_whose_first_entry_is_not_the_lock(target, bundle_tar, tmp_path):
    members = read_tar(bundle_tar)
    refused(target, write_tar(tmp_path / "bad.tar", members[1:] + members[:1]), "first entry")


def test_not_a_bundle_at_all(target, tmp_path):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tar" * 100)
    refused(target, junk, "not a readable tar")
    (tmp_path / "empty").mkdir()
    refused(target, tmp_path / "empty", LOCK_NAME)


def test_unexpected_file_in_the_folder(target, bundle_dir):
    (blob_of(bundle_dir).parent / "extra.bin").write_bytes(b"x")
    refused(target, bundle_dir, "extra.bin", "does not name")


def test_code_in_a_bundle_is_refused(target, bundle_dir):
    def edit(doc):
        doc["models"][0]["files"][0]["path"] = doc["models"][0]["primary"] = "model.py"

    edit_lock(bundle_dir, edit)
    refused(target, bundle_dir, "carries code", "model.py")


def test_lfs_oid_that_does_not_match_its_pointer(target, bundle_dir):
    edit_lock(bundle_dir, lambda doc: doc["models"][0]["files"][0].__setitem__("git_oid", "0" * 40))
    refused(target, bundle_dir, "git_oid does not match")


def test_one_bad_model_means_none_is_registered(source, target, tiny_model, tiny_gguf_no_template, tmp_path):
    source.store().import_path(tiny_gguf_no_template, name="tiny2")
    export_bundle(source.store(), ["tiny", "tiny2"], tmp_path / "two")
    blob = next((tmp_path / "two").glob("hub/models--local--tiny2/blobs/*"))
    data = bytearray(blob.read_bytes())
    data[123] ^= 1
    blob.write_bytes(bytes(data))
    refused(target, tmp_path / "two", "tiny2", "sha256")


def test_consistent_lock_but_not_a_model(target, bundle_dir):
    """Hashes can be made to match anything; the store's GGUF validation still has the last word."""
    import hashlib

    from localrun.modelstore.gitids import lfs_git_oid

    junk = b"GGUF" + bytes(range(256)) * 64
    old = blob_of(bundle_dir)
    sha = hashlib.sha256(junk).hexdigest()
    (old.parent / sha).write_bytes(junk)
    old.unlink()
    link = next(bundle_dir.glob("hub/models--*/snapshots/*/*"))
    link.unlink()
    os.symlink(f"../../blobs/{sha}", link)

    def edit(doc):
        f = doc["models"][0]["files"][0]
        f.update(sha256=sha, size=len(junk), git_oid=lfs_git_oid(sha, len(junk)))

    edit_lock(bundle_dir, edit)
    store = target.store()
    with pytest.raises(InvalidModelFile) as info:
        import_bundle(store, bundle_dir)
    assert not isinstance(info.value, BundleError) and "tiny-llama.gguf" in str(info.value), info.value
    assert store.list() == [] and not list(target.hf_cache.glob("models--*/blobs/*"))
    assert not [p for p in target.hf_cache.glob("models--*/snapshots/*/*")]


def test_disk_space_is_checked_before_the_first_byte(target, bundle_tar, monkeypatch):
    from collections import namedtuple

    from localrun.errors import DownloadFailed
    from localrun.modelstore import download

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(download.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    store = target.store()
    with pytest.raises(DownloadFailed, match="not enough disk space"):
        import_bundle(store, bundle_tar)
    assert store.list() == [] and not list(target.hf_cache.rglob("*.bundle-partial"))


def test_blob_that_is_a_symlink(target, bundle_dir, tmp_path):
    blob = blob_of(bundle_dir)
    outside = tmp_path / "outside.gguf"
    blob.rename(outside)
    os.symlink(outside, blob)  # same bytes, but outside the bundle
    refused(target, bundle_dir, blob.name, "pointing out of the bundle")


def test_disk_full_mid_import_is_a_clear_error_and_the_rerun_carries_on(target, bundle_tar, monkeypatch):
    import errno

    from localrun.errors import DownloadFailed
    from localrun.modelstore.bundle import importer

    real = importer.hash_stream

    def full(stream, item, sink=None):
        if sink is not None:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(stream, item, sink)

    monkeypatch.setattr(importer, "hash_stream", full)
    store = target.store()
    with pytest.raises(DownloadFailed, match="disk full"):
        import_bundle(store, bundle_tar)
    assert store.list() == [] and not list(target.hf_cache.rglob("*.bundle-partial"))
    monkeypatch.setattr(importer, "hash_stream", real)
    assert [r.name for r in import_bundle(store, bundle_tar).records] == ["tiny"]


def test_disk_full_while_exporting_leaves_nothing(source, tiny_model, tmp_path, monkeypatch):
    import errno

    from localrun.errors import LocalrunError
    from localrun.modelstore.bundle import export

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export, "hash_stream", full)
    with pytest.raises(LocalrunError, match="disk full"):
        export_bundle(source.store(), ["tiny"], tmp_path / "b")
    assert list(tmp_path.iterdir()) == []
