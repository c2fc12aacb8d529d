"""The disk tier through real llama.cpp sessions on the tiny random GGUF (plain attention):
what one session leaves on disk when it closes, the next session on the same folder restores,
counts as cached, and answers exactly as a cold run (``exact_prefix``: a cached prefix then
gives what a cold prefill gives, see scheduler.py).

Sliding-window models (Gemma 3) restore only whole entries: llama.cpp's state read keeps just
the window of an SWA layer, so a restored sequence cannot be cut back (see prefix_disk.py)."""

from __future__ import annotations

import dataclasses
import os

from localrun.types import FileEntry, ModelRecord
from tests.batching.conftest import load, request, run
from tests.conftest import needs_llama

pytestmark = [needs_llama]

EXACT = {"exact_prefix": True}
LONG = "hello the world is big and the time is now " * 12


def _keyed(session_opts, path, kv_dir):
    """A session with the disk tier on ``kv_dir`` (host RAM off: the slot goes to disk at close)."""
    return load(path, n_slots=1, slot_ctx=256, kv_dir=str(kv_dir), kv_ram_bytes=0, **session_opts)


def _with_sha(monkeypatch, sha="ab" * 32):
    """Sessions opened from now on see a record whose file has ``sha`` (the tier's key needs one)."""
    from localrun.runtimes.llamacpp import session as session_mod

    real_open = session_mod.LlamaCppSession.open.__func__

    def open_with_sha(cls, record: ModelRecord, plan):
        files = (FileEntry(path=record.path, size=1, sha256=sha),) if sha else ()
        return real_open(cls, dataclasses.replace(record, files=files), plan)

    monkeypatch.setattr(session_mod.LlamaCppSession, "open", classmethod(open_with_sha))


def _cold_then_closed(tiny_gguf, tmp_path, first_prompt: str) -> str:
    """The cold answer to ``LONG + "one"``, after a first keyed session answered ``first_prompt``
    and closed (which writes its slot's prefix and waits for the file)."""
    cold = load(tiny_gguf, n_slots=1, slot_ctx=256, prefix_cache=False, **EXACT)
    try:
        ref = run(cold, request(LONG + "one", max_tokens=12)).text
    finally:
        cold.close()
    first = _keyed(EXACT, tiny_gguf, tmp_path)
    try:
        run(first, request(first_prompt, max_tokens=12))
    finally:
        first.close()
    assert list(tmp_path.rglob("*.kv"))
    return ref


def test_a_closed_sessions_prefix_is_restored_by_the_next_one(tiny_gguf, tmp_path, monkeypatch):
    _with_sha(monkeypatch)
    ref = _cold_then_closed(tiny_gguf, tmp_path, LONG + "two")
    second = _keyed(EXACT, tiny_gguf, tmp_path)
    try:
        got = run(second, request(LONG + "one", max_tokens=12))
        stats = second._sched.cache.stats()
    finally:
        second.close()
    assert got.usage.cached_tokens > 0 and stats.disk_hits == 1
    assert stats.disk_restored_tokens == got.usage.cached_tokens
    assert got.text == ref


def test_a_file_from_another_model_is_not_restored(tiny_gguf, tmp_path, monkeypatch):
    _with_sha(monkeypatch, "ab" * 32)
    first = _keyed(EXACT, tiny_gguf, tmp_path)
    try:
        run(first, request(LONG, max_tokens=4))
    finally:
        first.close()
    monkeypatch.undo()
    _with_sha(monkeypatch, "cd" * 32)  # another model file: another key, another folder
    second = _keyed(EXACT, tiny_gguf, tmp_path)
    try:
        got = run(second, request(LONG, max_tokens=4))
    finally:
        second.close()
    assert got.usage.cached_tokens == 0


def test_without_a_sha256_the_key_is_the_files_fingerprint(tiny_gguf, tmp_path, monkeypatch):
    """An imported model (no sha256 until ``verify``) still gets a disk cache, keyed by the file
    as it is: the same file restores, the same file touched (another mtime) restores nothing."""
    _with_sha(monkeypatch, "")
    model = tmp_path / "model.gguf"
    model.write_bytes(tiny_gguf.read_bytes())
    kv = tmp_path / "kv"
    first = _keyed(EXACT, model, kv)
    try:
        run(first, request(LONG + "two", max_tokens=4))
    finally:
        first.close()
    assert list(kv.rglob("*.kv"))
    again = _keyed(EXACT, model, kv)
    try:
        assert run(again, request(LONG + "one", max_tokens=4)).usage.cached_tokens > 0
    finally:
        again.close()
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touched = _keyed(EXACT, model, kv)
    try:
        assert run(touched, request(LONG + "one", max_tokens=4)).usage.cached_tokens == 0
        assert touched._sched.cache.stats().disk_hits == 0
    finally:
        touched.close()


def test_a_session_starts_warm_and_its_first_request_reads_nothing(tiny_gguf, tmp_path, monkeypatch):
    """The newest prefix on disk is in a slot once the load returns (prefix.PrefixCache.warm): the
    restart's first request reuses that slot in place, with no read on its path, and is counted as
    the disk hit it is, with the cold answer."""
    _with_sha(monkeypatch)
    ref = _cold_then_closed(tiny_gguf, tmp_path, LONG + "one")
    second = _keyed(EXACT, tiny_gguf, tmp_path)
    try:
        cache = second._sched.cache
        warm = len(cache.slots[0].tokens)
        read_before = cache.stats().disk_read_bytes
        got = run(second, request(LONG + "one", max_tokens=12))
        stats = cache.stats()
    finally:
        second.close()
    assert warm > 100 and read_before > 0, "the slot was restored while loading"
    assert stats.disk_read_bytes == read_before, "the request read nothing"
    assert stats.disk_hits == 1 and stats.disk_restored_tokens == got.usage.cached_tokens > 100
    assert got.text == ref
