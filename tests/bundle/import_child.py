"""One `bundle import` in a child process that kills itself (SIGKILL, as kill -9 would) at a
chosen point, so tests can check that running the import again converges.

    python -m tests.bundle.import_child BUNDLE POINT N     (env: LOCALRUN_HOME, HF_HOME)

POINT: none (no kill), write (halfway through writing a blob's bytes), journal (a blob renamed into place,
not yet journaled), after-journal, ref (snapshot links made, model not registered), index
(after a model's index transaction). N: on which occurrence (1-based).
"""

from __future__ import annotations

import os
import signal
import sys


def _killer(n: int):
    count = {"k": 0}

    def tick() -> None:
        count["k"] += 1
        if count["k"] >= n:
            os.kill(os.getpid(), signal.SIGKILL)

    return tick


def main() -> int:
    from localrun.modelstore.bundle import importer
    from localrun.modelstore.hfcache import CacheLayout
    from localrun.modelstore.index import ModelIndex
    from localrun.modelstore.store import ModelStore
    from localrun.settings import load_settings

    path, point, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tick = _killer(n)
    if point == "write":
        real = importer.hash_stream

        class HalfSink:
            def __init__(self, f):
                self.f = f

            def write(self, data):
                self.f.write(data[: len(data) // 2])
                self.f.flush()
                tick()
                self.f.write(data[len(data) // 2 :])

        importer.hash_stream = lambda stream, item, sink=None: real(stream, item, HalfSink(sink) if sink else None)
    elif point in ("journal", "after-journal"):
        real_add = importer._Journal.add

        def add(self, blob, sha256):
            if point == "journal":
                tick()
            real_add(self, blob, sha256)
            if point == "after-journal":
                tick()

        importer._Journal.add = add
    elif point == "ref":
        real_ref = CacheLayout.write_ref
        CacheLayout.write_ref = lambda self, rev, commit: (real_ref(self, rev, commit), tick())
    elif point == "index":
        real_index = ModelIndex.add
        ModelIndex.add = lambda self, rec, **kw: (real_index(self, rec, **kw), tick())[0]
    result = importer.import_bundle(ModelStore(load_settings()), path)
    sys.stdout.write(" ".join(r.name for r in result.records) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
