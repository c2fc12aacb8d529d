"""The disk tier (runtimes/llamacpp/cache/kv_disk.py) on its own: blobs are bytes, no llama.cpp.

What it must never do: hand back a blob that is not exactly the one written under the same key
and tokens, raise at its caller over a bad file, hold the caller while it writes, or let the
root grow past its budget, whoever else writes into it."""

from __future__ import annotations

import io
import logging
import os
import signal
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

from localrun.runtimes.llamacpp.cache import kv_disk, kv_file, kv_root
from localrun.runtimes.llamacpp.cache.kv_disk import DiskTier, StateKey
from tests.batching.kv_disk_child import blob_for, key

CHILD = Path(__file__).with_name("kv_disk_child.py")


def tier(root: Path, model: str = "alpha", budget: int = 1 << 30, **kw) -> DiskTier:
    return DiskTier(root, key(model), budget_bytes=budget, **kw)


def stored(t: DiskTier, tokens, nbytes: int = 1000, kind: str = "prefix") -> Path:
    """Put one entry, wait for it, return its file."""
    tokens = tuple(tokens)
    assert t.put(tokens, blob_for(tokens, nbytes), kind=kind)
    t.flush()
    (entry,) = [e for e in t.entries() if e.tokens == tokens and e.kind == kind]
    return entry.path


def root_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in (kv_root.KEY_FILE, kv_root.LOCK_FILE))


def test_round_trip_keeps_tokens_kind_and_blob(tmp_path):
    t = tier(tmp_path)
    tokens = (1, 2, 3, -5, 2**31 - 1, -(2**31))  # negative: media pseudo-tokens
    blob = os.urandom(3 * kv_file.CHUNK + 17)  # spans several write and checksum chunks
    assert t.put(tokens, blob) and t.put(tokens[:3], b"ckpt", kind="checkpoint")
    t.flush()
    by_kind = {e.kind: e for e in t.entries()}
    assert by_kind["prefix"].tokens == tokens and by_kind["checkpoint"].tokens == tokens[:3]
    assert by_kind["prefix"].model_name == "alpha"
    assert by_kind["prefix"].nbytes == by_kind["prefix"].path.stat().st_size
    assert t.load(by_kind["prefix"]) == blob and t.load(by_kind["checkpoint"]) == b"ckpt"
    c = t.counters()
    assert c["hits"] == 2 and c["misses"] == 0 and c["entries"] == 2 and c["tokens"] == len(tokens) + 3
    assert c["written_bytes"] == c["bytes"] == c["read_bytes"] == sum(e.nbytes for e in by_kind.values())
    info = kv_root.read_key_file(t.folder)
    assert t.folder.name == t.key.digest() == info["digest"] and info["model_name"] == "alpha"
    assert info["params"] == {"type_k": "f16", "n_ctx_seq": "512"} and info["runtime"] == "test-runtime"
    t.close()
    again = tier(tmp_path)  # a restart: a new process finds the same entries
    assert {e.tokens for e in again.entries()} == {tokens, tokens[:3]}


def test_the_key_is_stable_and_every_identity_field_counts():
    k = key("alpha")
    code = "from tests.batching.kv_disk_child import key; print(key('alpha').digest())"
    other_process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other_process.stdout.strip() == k.digest()
    assert StateKey(k.model_sha256, k.runtime, tuple(reversed(k.params))).digest() == k.digest()
    assert StateKey(k.model_sha256, k.runtime, k.params, model_name="renamed").digest() == k.digest()
    variants = [
        StateKey("0" * 64, k.runtime, k.params),
        StateKey(k.model_sha256, "other-build", k.params),
        StateKey(k.model_sha256, k.runtime, (("type_k", "q8_0"), ("n_ctx_seq", "512"))),
        StateKey(k.model_sha256, k.runtime, (*k.params, ("n_swa", "512"))),
    ]
    assert len({v.digest() for v in variants} | {k.digest()}) == 5


def test_a_tier_without_a_key_or_budget_stores_nothing(tmp_path):
    for off in (DiskTier(tmp_path, StateKey("", "rt", ()), budget_bytes=1 << 20), tier(tmp_path, budget=0)):
        assert not off.enabled and not off.put((1, 2), b"x") and off.entries() == [] and off.load is not None
    assert root_files(tmp_path) == []


def _bad_file_is_refused(t: DiskTier, path: Path, content: bytes) -> None:
    """Put ``content`` where an entry lives and check the tier refuses and removes it."""
    path.write_bytes(content)
    listed = [e for e in t.entries() if e.path == path]
    if listed:  # header and tokens passed: the blob's check must catch it
        assert t.load(listed[0]) is None
    assert not path.exists(), f"{path.name} was left in place"


def test_one_byte_flipped_anywhere_is_refused_and_removed(tmp_path, caplog):
    t = tier(tmp_path)
    path = stored(t, range(8), nbytes=64)
    good = path.read_bytes()
    misses = t.counters()["misses"]
    caplog.set_level(logging.WARNING, logger=kv_disk.__name__)
    for i in range(len(good)):
        flipped = bytearray(good)
        flipped[i] ^= 0x01
        _bad_file_is_refused(t, path, bytes(flipped))
    assert t.counters()["misses"] - misses == len(good) == t.counters()["corrupt"]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == len(good), "one warning per bad file"
    path.write_bytes(good)
    assert t.load(t.entries()[0]) == blob_for(tuple(range(8)), 64), "the intact file still loads"


def test_truncated_extended_empty_and_garbage_files_are_refused(tmp_path, caplog):
    t = tier(tmp_path)
    path = stored(t, range(50), nbytes=5000)
    good = path.read_bytes()
    cuts = [0, 1, 7, kv_file.HEADER_SIZE - 1, kv_file.HEADER_SIZE, kv_file.HEADER_SIZE + 100, len(good) - 1]
    bad = [good[:n] for n in cuts] + [
        good + b"\0",
        os.urandom(len(good)),
        os.urandom(10),
        kv_file.MAGIC + os.urandom(500),
    ]
    caplog.set_level(logging.WARNING, logger=kv_disk.__name__)
    for content in bad:
        _bad_file_is_refused(t, path, content)
    assert t.counters()["corrupt"] == len(bad)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == len(bad)
    assert t.entries() == [], "nothing was logged twice: every bad file is gone"


def test_another_keys_file_renamed_into_place_is_refused(tmp_path):
    mine, theirs = tier(tmp_path, "alpha"), tier(tmp_path, "beta")
    mine_path = stored(mine, range(20))
    their_path = stored(theirs, range(20))
    assert mine_path.name == their_path.name, "same tokens, same name: only the key tells them apart"
    os.replace(their_path, mine_path)
    _bad_file_is_refused(mine, mine_path, mine_path.read_bytes())


def test_a_future_format_version_is_refused(tmp_path):
    t = tier(tmp_path)
    path = stored(t, range(10))
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, 8, kv_file.FORMAT_VERSION + 1)
    head = kv_file.HEADER_SIZE - 4
    struct.pack_into("<I", raw, head, zlib.crc32(bytes(raw[:head])))  # a well-formed header of a newer localrun
    with pytest.raises(kv_file.BadFile, match="format version"):  # the version check, not a checksum, refuses it
        kv_file.read_header(io.BytesIO(bytes(raw)), size=len(raw), digest=bytes.fromhex(t.key.digest()))
    _bad_file_is_refused(t, path, bytes(raw))


def test_a_file_vanishing_under_a_reader_is_a_quiet_miss(tmp_path, caplog):
    t = tier(tmp_path)
    path = stored(t, range(10))
    (entry,) = t.entries()
    path.unlink()  # another process evicted it
    caplog.set_level(logging.WARNING)
    assert t.load(entry) is None
    assert t.counters()["misses"] == 1 and t.counters()["corrupt"] == 0 and not caplog.records


def test_a_loaded_blob_survives_its_file_being_replaced_or_unlinked(tmp_path):
    """A load maps the file instead of reading it: what another process does next (rename a
    newer file over it, evict it) must not change the bytes llama.cpp is about to restore."""
    t = tier(tmp_path)
    tokens, size = tuple(range(40)), kv_file.CHUNK + 123
    path = stored(t, tokens, size)
    want = bytes(blob_for(tokens, size))
    (entry,) = t.entries()
    got = t.load(entry)
    assert got == want
    other = tier(tmp_path / "other")
    newer = other.folder / "newer.kv"
    newer.write_bytes(os.urandom(path.stat().st_size))
    os.replace(newer, path)  # the same name, other content: the writers' atomic rename
    assert got == want
    path.unlink()  # another process evicted it
    assert got == want


def test_put_returns_before_the_disk_is_written(tmp_path):
    t = tier(tmp_path, queue_bytes=1)
    gate = threading.Event()
    real = t._write_file

    def held(tmp, job):
        gate.wait()
        real(tmp, job)

    t._write_file = held
    assert t.put(range(10), b"a" * 1000), "the first blob is taken whatever the queue bound"
    assert t.put(range(10), b"a" * 1000), "the same tokens again: already queued"
    assert not t.put(range(11), b"b" * 1000), "the queue is full: dropped, not waited for"
    assert t.entries() == [] and root_files(tmp_path) == []
    gate.set()
    t.flush()
    assert [e.tokens for e in t.entries()] == [tuple(range(10))]
    assert t.counters()["dropped"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_writer_thread_runs_at_a_lower_priority(tmp_path):
    t = tier(tmp_path)
    stored(t, range(3))
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, t.writer_tid) == min(19, mine + kv_disk.WRITER_NICE)
    assert os.sched_getscheduler(t.writer_tid) == os.SCHED_IDLE, "a core only when decoding leaves one"
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine, "only the writer thread, not the process"


def test_equal_tokens_are_written_once(tmp_path):
    t = tier(tmp_path)
    path = stored(t, range(30))
    written = t.counters()["written_bytes"]
    assert t.put(range(30), b"other blob, same tokens")
    t.flush()
    assert t.counters()["written_bytes"] == written and t.load(t.entries()[0]) == blob_for(tuple(range(30)), 1000)
    assert root_files(tmp_path) == [path]


def test_the_budget_holds_under_200_prefixes_over_two_models(tmp_path):
    size = kv_file.HEADER_SIZE + 4 * 12 + 1000
    budget = 30 * size + size // 2
    a, b = tier(tmp_path, "alpha", budget), tier(tmp_path, "beta", budget)
    for i in range(200):
        (a if i % 2 else b).put((i, *range(11)), blob_for((i,), 1000))
        if i % 20 == 0:
            a.flush(), b.flush()
        assert kv_root.cache_bytes(tmp_path) <= budget  # the writers are busy: files vanish while counted
    a.flush(), b.flush()
    assert len(root_files(tmp_path)) == 30
    assert not a.put(range(5), b"x" * budget), "an entry larger than the whole budget is refused"


def test_eviction_is_least_recently_used_and_a_load_refreshes(tmp_path):
    size = kv_file.HEADER_SIZE + 4 * 5 + 1000
    t = tier(tmp_path, budget=3 * size)
    paths = [stored(t, (i, 1, 2, 3, 4)) for i in range(3)]
    for age, path in enumerate(paths):  # explicit times: file clocks are coarser than these writes
        os.utime(path, (1000.0 + age, 1000.0 + age))
    oldest = next(e for e in t.entries() if e.path == paths[0])
    assert t.load(oldest) is not None  # now the most recently used
    stored(t, (9, 1, 2, 3, 4))
    assert paths[0].exists() and not paths[1].exists() and paths[2].exists()


def test_two_processes_sharing_a_root_leave_only_loadable_files_within_budget(tmp_path):
    budget = 600_000
    children = [
        subprocess.Popen([sys.executable, str(CHILD), "many", str(tmp_path), model, "60", str(budget)])
        for model in ("alpha", "beta", "alpha")
    ]
    assert [c.wait(timeout=120) for c in children] == [0, 0, 0]
    files = root_files(tmp_path)
    assert files and sum(p.stat().st_size for p in files) <= budget
    assert all(p.suffix == ".kv" for p in files), "no temp file is left behind"
    loaded = 0
    for model in ("alpha", "beta"):
        t = tier(tmp_path, model, budget)
        for e in t.entries():
            assert t.load(e) == blob_for(e.tokens, 20_000 + 37 * e.tokens[2])
            loaded += 1
    assert loaded == len(files)


def test_a_kill_mid_write_leaves_nothing_that_loads(tmp_path):
    child = subprocess.Popen(
        [sys.executable, str(CHILD), "slow", str(tmp_path), "alpha", str(8 << 20)], stdout=subprocess.PIPE, text=True
    )
    try:
        for _ in range(3):  # a few chunks are on disk
            assert child.stdout.readline() == "writing\n"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    temps = [p for p in tmp_path.rglob("*") if p.name.startswith(kv_root.TEMP_PREFIX)]
    assert len(temps) == 1 and f"-{child.pid}-" in temps[0].name, "the write was cut short"
    assert kv_disk.list_entries(tmp_path) == []
    t = tier(tmp_path)  # the next process sweeps what the dead writer left
    assert t.entries() == [] and not temps[0].exists() and root_files(tmp_path) == []


def test_temp_files_of_live_writers_are_left_alone(tmp_path):
    folder = tmp_path / key("alpha").digest()
    folder.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        names = {
            "live": f"{kv_root.TEMP_PREFIX}{live.pid}-1-x.kv",
            "dead": f"{kv_root.TEMP_PREFIX}{dead.pid}-1-x.kv",
            "mine": kv_root.temp_name("x.kv", 1),
            "stale": f"{kv_root.TEMP_PREFIX}{live.pid}-2-x.kv",
        }
        for name in names.values():
            (folder / name).write_bytes(b"partial")
        old = (folder / names["stale"]).stat().st_mtime - kv_root.TEMP_MAX_AGE_S - 1
        os.utime(folder / names["stale"], (old, old))
        assert kv_root.sweep_temp(folder) == 2
        assert {p.name for p in folder.iterdir()} == {names["live"], names["mine"]}
    finally:
        live.kill()
        live.wait()


def test_read_speed_starts_conservative_and_is_measured(tmp_path):
    t = tier(tmp_path)
    assert t.read_bytes_per_s == kv_disk.DEFAULT_READ_BYTES_PER_S
    stored(t, range(4), nbytes=100)
    t.load(t.entries()[0])
    assert t.read_bytes_per_s == kv_disk.DEFAULT_READ_BYTES_PER_S, "a tiny load says nothing about throughput"
    stored(t, range(5), nbytes=4 << 20)
    t.load(next(e for e in t.entries() if len(e.tokens) == 5))
    first = t.measured_read_bytes_per_s
    assert first and t.read_bytes_per_s == first, "the first measurement replaces the guess"
    t.read_bytes_per_s = prior = 1e6  # a speed kept from an earlier run
    t.load(next(e for e in t.entries() if len(e.tokens) == 5))
    now = t.measured_read_bytes_per_s
    assert t.read_bytes_per_s == pytest.approx(prior + kv_disk.SMOOTHING * (now - prior)), "later ones are smoothed"


def test_default_budget_is_a_share_of_free_disk(tmp_path, monkeypatch):
    def free(n):
        monkeypatch.setattr(kv_root.shutil, "disk_usage", lambda _p: kv_root.shutil._ntuple_diskusage(4 * n, 3 * n, n))

    free(100 << 30)
    assert kv_disk.default_budget(tmp_path / "not" / "yet") == int(0.1 * (100 << 30))
    free(10 << 40)
    assert kv_disk.default_budget(tmp_path) == 32 << 30
    free(1 << 30)
    assert kv_disk.default_budget(tmp_path) == 0, "a nearly full disk: the tier is off"


def test_list_entries_and_clear_need_no_tier(tmp_path):
    a, b = tier(tmp_path, "alpha"), tier(tmp_path, "beta")
    stored(a, range(10)), stored(a, range(20)), stored(b, range(30), nbytes=3000)
    listed = kv_disk.list_entries(tmp_path)
    assert sorted((e.model_name, len(e.tokens)) for e in listed) == [("alpha", 10), ("alpha", 20), ("beta", 30)]
    assert kv_disk.clear(tmp_path, "nobody") == (0, 0)
    files, nbytes = kv_disk.clear(tmp_path, "alpha")
    assert files == 2 and nbytes == sum(e.nbytes for e in listed if e.model_name == "alpha")
    assert [e.model_name for e in kv_disk.list_entries(tmp_path)] == ["beta"] and not a.folder.exists()
    assert stored(a, range(40)).exists(), "a running tier writes again after a clear took its folder"
    left = sum(e.nbytes for e in kv_disk.list_entries(tmp_path))
    assert kv_disk.clear(tmp_path) == (2, left)
    assert kv_disk.list_entries(tmp_path) == [] and kv_root.key_folders(tmp_path) == []
