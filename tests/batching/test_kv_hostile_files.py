"""Files in the KV cache folder that are not what they seem: a FIFO or a folder under an entry's
name, and a header claiming more tokens than any context. Before, a FIFO blocked whoever opened it
(a model load past 120 s; ``cache ls`` and ``cache clear`` never returned), ``cache clear``
crashed on a sub-folder, and ``read_header`` read ``4 × n_tokens`` bytes before checking them."""

from __future__ import annotations

import io
import os
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest

from localrun.jsonfile import NotARegularFile, open_regular, read_regular
from localrun.runtimes.llamacpp.cache import kv_file, kv_root
from tests.batching.test_kv_disk import stored, tier
from tests.cli.test_cli_e2e import lr


def _unblocker(fifo: Path, after_s: float = 8.0) -> threading.Thread:
    """Opens ``fifo`` for writing after a while, so a reader blocked on it (the bug) is released
    and the test fails on its clock instead of hanging the suite."""

    def run() -> None:
        time.sleep(after_s)
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader waiting: nothing to release
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_open_regular_refuses_fifos_folders_and_devices_at_once(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, kind in [(fifo, "FIFO"), (tmp_path, "directory"), (Path("/dev/zero"), "character device")]:
        with pytest.raises(NotARegularFile, match=kind):
            open_regular(path)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    with pytest.raises(NotARegularFile, match="100 bytes, more than the 99"):
        read_regular(big, max_bytes=99)
    assert read_regular(big, max_bytes=100) == b"x" * 100


def test_a_fifo_under_an_entrys_name_is_a_miss_not_a_hang(tmp_path):
    t = tier(tmp_path)
    path = stored(t, range(40))
    (entry,) = t.entries()
    path.unlink()
    os.mkfifo(path)
    _unblocker(path)
    started = time.monotonic()
    assert t.load(entry) is None
    assert time.monotonic() - started < 5
    t.close()


def test_a_header_claiming_billions_of_tokens_is_refused_before_they_are_read():
    digest = b"k" * 32
    n = kv_file.MAX_TOKENS + 1
    head = struct.pack("<8sHBB32sIQdIQ", kv_file.MAGIC, kv_file.FORMAT_VERSION, 0, 0, digest, n, 0, 0.0, 0, 0)
    raw = head + struct.pack("<I", zlib.crc32(head))  # a valid header checksum: it guards rot, not intent
    f = io.BytesIO(raw + bytes(4096))
    with pytest.raises(kv_file.BadFile, match="more than the"):
        kv_file.read_header(f, size=kv_file.HEADER_SIZE + 4 * n, digest=digest)
    assert f.tell() == kv_file.HEADER_SIZE  # not one token id was read


def test_cache_ls_and_clear_pass_a_fifo_and_a_folder(tmp_path, _isolated_home):
    root = _isolated_home / "cache" / "kv"
    t = tier(root)
    path = stored(t, range(30))
    t.close()
    fifo = path.with_name("0" * 16 + kv_root.SUFFIX)
    os.mkfifo(fifo)
    (path.parent / "stray-folder").mkdir()
    _unblocker(fifo, 25.0)
    listed = lr("cache", "ls", "--json", timeout=20)
    assert '"entries": 1' in listed.stdout
    cleared = lr("cache", "clear", timeout=20)
    assert "removed" in cleared.stdout, cleared.stderr
    assert not path.exists() and (path.parent / "stray-folder").is_dir()
