"""A hub that misbehaves, a disk that fills, hostile names, concurrent pulls: every case
ends in a correct file or a typed error, never in a corrupt file at a final path."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from localrun.errors import AccessDenied, DownloadFailed, InvalidName
from localrun.modelstore import download
from localrun.modelstore.pull import plan_pull, pull
from localrun.modelstore.verify import verify
from tests.hub import repos
from tests.hub.fakehub import FakeHub
from tests.hub.hostile import HOSTILE_NAMES

MID = "testorg/Mid-GGUF"
MID_FILE = "Mid-Q4_K_M.gguf"


@pytest.fixture
def mid(fake_hub):
    """A 6 MiB GGUF: several 1 MiB chunks, so faults can land mid-file."""
    fake_hub.add_repo(MID, {MID_FILE: repos.make_gguf(payload=6 * 1024 * 1024, seed=8)})
    return fake_hub.file(MID, MID_FILE)


def blobs_dir(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--")) / "blobs"


def final_blob(cache: Path, repo: str, sha: str) -> Path:
    return blobs_dir(cache, repo) / sha


def resolve_gets(hub):
    return [r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path]


def test_reset_at_half_resumes_with_range(fake_hub, store, mid, hf_cache):
    size = len(mid.data)
    fake_hub.faults.drop_at = size // 2
    record = pull(store, MID)
    gets = resolve_gets(fake_hub)
    assert len(gets) == 2 and gets[0].range is None
    assert gets[1].range == f"bytes={size // 2}-"
    assert fake_hub.bytes_served(MID_FILE) == size
    assert record.files[0].sha256 == mid.sha256 == hashlib.sha256(Path(record.path).read_bytes()).hexdigest()


def test_server_ignoring_range_restarts_from_zero(fake_hub, store, mid):
    size = len(mid.data)
    fake_hub.faults.drop_at = size // 2
    fake_hub.faults.ignore_range = True
    record = pull(store, MID)
    gets = resolve_gets(fake_hub)
    assert gets[1].range == f"bytes={size // 2}-" and gets[1].status == 200
    assert Path(record.path).read_bytes() == mid.data


def test_403_with_html_body_is_access_denied_and_nothing_is_kept(fake_hub, store, mid, hf_cache):
    fake_hub.faults.forbidden_html = True
    with pytest.raises(AccessDenied) as err:
        pull(store, MID)
    assert MID in str(err.value) and "HF_TOKEN" in str(err.value)
    folder = blobs_dir(hf_cache, MID)
    assert not folder.exists() or list(folder.iterdir()) == []
    assert store.index.find("testorg/mid-gguf:q4_k_m") is None


def test_redirect_to_another_host_gets_the_file_without_leaking_the_token(fake_hub, store, monkeypatch):
    cdn = FakeHub().share_repos_with(fake_hub).start()
    try:
        fake_hub.faults.redirect_to = cdn.url
        monkeypatch.setenv("HF_TOKEN", repos.GATED_TOKEN)
        cdn_repo = fake_hub.repos[repos.GATED_REPO]
        cdn_repo.gated = False  # the CDN serves signed URLs; the token must not follow the redirect
        record = pull(store, repos.GATED_REPO)
        assert Path(record.path).read_bytes() == fake_hub.file(repos.GATED_REPO, "Secret-Q4_K_M.gguf").data
        assert resolve_gets(cdn) and all(r.authorization is None for r in cdn.requests)
        assert all(r.authorization == f"Bearer {repos.GATED_TOKEN}" for r in resolve_gets(fake_hub))
    finally:
        cdn.stop()


def test_bytes_that_do_not_match_the_listing_are_never_committed(fake_hub, store, mid, hf_cache):
    plan = plan_pull(MID)
    tampered = bytearray(mid.data)
    tampered[len(tampered) // 3] ^= 0x01
    mid.data = bytes(tampered)  # the hub now serves other bytes than its listing promised
    with pytest.raises(DownloadFailed, match="do not match"):
        pull(store, plan)
    assert not final_blob(hf_cache, MID, plan.files[0].sha256).exists()
    assert list(blobs_dir(hf_cache, MID).iterdir()) == []
    assert store.index.find(plan.name) is None


def test_resumed_partial_that_does_not_verify_is_fetched_again(fake_hub, store, mid, hf_cache):
    blob = final_blob(hf_cache, MID, mid.sha256)
    blob.parent.mkdir(parents=True)
    Path(str(blob) + ".incomplete").write_bytes(b"\0" * 1000)  # garbage from some crash
    record = pull(store, MID)
    assert Path(record.path).read_bytes() == mid.data
    assert [g.range for g in resolve_gets(fake_hub)] == ["bytes=1000-", None]


def test_corrupt_blob_already_in_cache_is_replaced(fake_hub, store, hf_cache):
    record = pull(store, repos.GGUF_REPO)
    blob = Path(record.path).resolve()
    blob.write_bytes(b"x" * blob.stat().st_size)
    fake_hub.reset_log()
    again = pull(store, repos.GGUF_REPO)
    assert len(resolve_gets(fake_hub)) == 1
    verify(again)


def test_disk_space_is_checked_before_the_first_byte(fake_hub, store, mid, monkeypatch):
    class Usage:
        free = 1024

    monkeypatch.setattr(download.shutil, "disk_usage", lambda path: Usage())
    with pytest.raises(DownloadFailed, match="not enough disk space"):
        pull(store, MID)
    assert resolve_gets(fake_hub) == []


def test_disk_full_mid_download(fake_hub, store, mid, hf_cache, monkeypatch):
    existing = pull(store, repos.GGUF_REPO)
    real_write = download._write
    budget = {"left": 2 * 1024 * 1024 + 123}

    def filling_write(f, data):
        if budget["left"] < len(data):
            f.write(data[: budget["left"]])
            budget["left"] = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        budget["left"] -= len(data)
        real_write(f, data)

    monkeypatch.setattr(download, "_write", filling_write)
    with pytest.raises(DownloadFailed, match="disk full") as err:
        pull(store, MID)
    assert "free some space" in str(err.value)
    assert not final_blob(hf_cache, MID, mid.sha256).exists()
    partial = Path(str(final_blob(hf_cache, MID, mid.sha256)) + ".incomplete")
    assert partial.stat().st_size == 2 * 1024 * 1024 + 123
    verify(existing)  # models already there are intact
    monkeypatch.setattr(download, "_write", real_write)
    fake_hub.reset_log()
    record = pull(store, MID)
    assert Path(record.path).read_bytes() == mid.data
    assert resolve_gets(fake_hub)[0].range == f"bytes={2 * 1024 * 1024 + 123}-"


def test_eight_concurrent_pulls_download_once(fake_hub, store, mid, hf_cache):
    fake_hub.faults.throttle_bps = 24 * 1024 * 1024  # long enough for all eight to overlap
    results, errors = [], []

    def worker():
        try:
            results.append(pull(store, MID))
        except Exception as exc:  # collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(results) == 8
    assert fake_hub.bytes_served(MID_FILE) == len(mid.data)
    assert sorted(p.name for p in blobs_dir(hf_cache, MID).iterdir()) == [mid.sha256]
    assert {r.files for r in results} == {results[0].files}
    assert hashlib.sha256(Path(results[0].path).read_bytes()).hexdigest() == mid.sha256
    assert [r.name for r in store.index.list()] == ["testorg/mid-gguf:q4_k_m"]


def _tree_snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_hostile_names_in_a_listing_are_refused(fake_hub, store, hf_cache, tmp_path):
    assert len(HOSTILE_NAMES) >= 40
    fake_hub.add_repo("evil/Repo-GGUF", {"Evil-Q4_K_M.gguf": repos.make_gguf(seed=66)})
    outside = tmp_path.parent
    before = _tree_snapshot(outside)
    refused = 0
    for name in HOSTILE_NAMES:
        lfs = {"oid": "a" * 64, "size": 10, "pointerSize": 134}
        fake_hub.repos["evil/Repo-GGUF"].extra_tree = [
            {"type": "file", "path": name, "size": 10, "oid": "b" * 40, "lfs": lfs}
        ]
        with pytest.raises(InvalidName):
            pull(store, "evil/Repo-GGUF")
        refused += 1
    assert refused == len(HOSTILE_NAMES)
    assert resolve_gets(fake_hub) == []
    assert _tree_snapshot(outside) - before <= {str(p.relative_to(outside)) for p in hf_cache.parent.rglob("*")}
    assert not (hf_cache / "models--evil--Repo-GGUF" / "snapshots").exists()


@pytest.mark.parametrize(
    "entry",
    [
        {
            "type": "file",
            "path": "x.gguf",
            "size": 10,
            "oid": "b" * 40,
            "lfs": {"oid": "../../etc/passwd", "size": 10, "pointerSize": 1},
        },
        {"type": "file", "path": "x.gguf", "size": -5, "oid": "b" * 40},
        {"type": "file", "path": "x.gguf", "size": "10", "oid": "b" * 40},
        {"type": "file", "path": "Evil-Q4_K_M.GGUF", "size": 1, "oid": "b" * 40},  # same name, other case
    ],
)
def test_hostile_hashes_and_sizes_are_refused(fake_hub, store, entry):
    fake_hub.add_repo("evil/Repo-GGUF", {"Evil-Q4_K_M.gguf": repos.make_gguf(seed=66)})
    fake_hub.repos["evil/Repo-GGUF"].extra_tree = [entry]
    with pytest.raises(InvalidName):
        pull(store, "evil/Repo-GGUF")


def test_hostile_commit_hash_is_refused(fake_hub, store, hf_cache):
    repo = fake_hub.repos[repos.GGUF_REPO]
    good = repo.refs["main"]
    repo.commits["../../../escape"] = repo.commits[good]
    repo.refs["main"] = "../../../escape"
    with pytest.raises(InvalidName, match="commit"):
        pull(store, repos.GGUF_REPO)
    assert not (hf_cache.parent / "escape").exists()


def test_symlink_planted_in_the_cache_is_refused(fake_hub, store, hf_cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    commit = fake_hub.repos[repos.GGUF_REPO].refs["main"]
    snapshots = hf_cache / "models--testorg--Tiny-GGUF" / "snapshots"
    snapshots.mkdir(parents=True)
    (snapshots / commit).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InvalidName, match="outside"):
        pull(store, repos.GGUF_REPO)
    assert list(elsewhere.iterdir()) == []


def test_sibling_prefix_outside_the_cache_is_refused(fake_hub, store, hf_cache):
    evil = Path(str(hf_cache) + "-evil")  # a "store-evil" next to the store
    evil.mkdir(parents=True)
    blobs = blobs_dir(hf_cache, repos.GGUF_REPO)
    blobs.parent.mkdir(parents=True)
    blobs.symlink_to(evil, target_is_directory=True)
    with pytest.raises(InvalidName):
        pull(store, repos.GGUF_REPO)
    assert list(evil.iterdir()) == []


@pytest.fixture
def small_tmpfs(tmp_path):
    """An 8 MiB tmpfs (root only; skipped elsewhere) for a disk that really fills up."""
    import subprocess

    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True).returncode
    ):
        pytest.skip("cannot mount a tmpfs here (needs root); the injected-ENOSPC test covers this")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_disk_full_mid_download_then_resume(fake_hub, store, mid, small_tmpfs, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(small_tmpfs / "hub"))
    fake_hub.faults.throttle_bps = 12 * 1024 * 1024
    partial = small_tmpfs / "hub" / "models--testorg--Mid-GGUF" / "blobs" / (mid.sha256 + ".incomplete")
    filler = small_tmpfs / "filler"

    def fill_when_started():
        while not partial.exists() or partial.stat().st_size < 1024 * 1024:
            time.sleep(0.005)
        try:  # take the rest of the disk while the pull is running
            with open(filler, "wb", buffering=0) as f:
                while True:
                    f.write(b"\0" * 65536)
        except OSError:
            pass  # the disk is full: that was the point

    t = threading.Thread(target=fill_when_started)
    t.start()
    with pytest.raises(DownloadFailed, match="disk full"):
        pull(store, MID)
    t.join(10)
    kept = partial.stat().st_size
    assert 0 < kept < len(mid.data) and not (partial.parent / mid.sha256).exists()
    filler.unlink()
    fake_hub.faults.throttle_bps = None
    fake_hub.reset_log()
    record = pull(store, MID)
    assert Path(record.path).read_bytes() == mid.data
    assert resolve_gets(fake_hub)[0].range == f"bytes={kept}-"


@pytest.mark.parametrize(
    "entry", [{"type": "file", "path": "x.gguf"}, {"type": "file"}, {"path": "x"}, "not-an-object"]
)
def test_malformed_listing_is_a_typed_error(fake_hub, store, entry):
    fake_hub.add_repo("evil/Repo-GGUF", {"Evil-Q4_K_M.gguf": repos.make_gguf(seed=66)})
    fake_hub.repos["evil/Repo-GGUF"].extra_tree = [entry]
    with pytest.raises((DownloadFailed, InvalidName)):
        pull(store, "evil/Repo-GGUF")
    assert resolve_gets(fake_hub) == []
