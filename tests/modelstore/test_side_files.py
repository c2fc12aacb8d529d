"""The store's side files (an HF cache repo's ``refs/main``) are read only when regular and small:
a FIFO planted there blocked every pull and load that read it."""

from __future__ import annotations

import os
import threading
import time

from localrun.modelstore.hfcache import CacheLayout


def test_a_fifo_or_a_giant_in_place_of_a_ref_is_no_ref(tmp_path):
    layout = CacheLayout(tmp_path, "org/repo")
    refs = layout.folder / "refs"
    refs.mkdir(parents=True)
    layout.write_ref("main", "a" * 40)
    assert layout.read_ref("main") == "a" * 40
    os.mkfifo(refs / "pipe")

    def release() -> None:  # so the bug fails the test on its clock instead of hanging the suite
        time.sleep(8)
        try:
            os.close(os.open(refs / "pipe", os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    threading.Thread(target=release, daemon=True).start()
    started = time.monotonic()
    assert layout.read_ref("pipe") is None
    assert time.monotonic() - started < 5
    with open(refs / "giant", "wb") as f:
        f.write(b"a" * 40)
        f.truncate(1 << 30)  # sparse: 40 hex digits then a gigabyte of hole
    assert layout.read_ref("giant") is None
