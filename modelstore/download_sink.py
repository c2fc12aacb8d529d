"""The downloader's write side: bytes written, hashed and flushed off the reading thread.

Split from :mod:`localrun.modelstore.download` (which reads the socket and decides what a
response means); the transfer object it is given holds the running hash and offset.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import BinaryIO, Protocol

_SYNC_EVERY = 32 * 1024 * 1024


class _Digest(Protocol):
    def update(self, data: bytes) -> None: ...


class Transfer(Protocol):
    """What the sink advances as bytes land: the running digest and the byte counts."""

    @property
    def digest(self) -> _Digest: ...

    offset: int
    fetched: int


class Sink:
    """Writes and hashes on a second thread while the first keeps reading the socket.

    recv, sha256, write and fdatasync all release the GIL, so the pipeline overlaps them;
    serially, hashing alone costs a third of a loopback download. Chunks go over in ~1 MiB
    batches to keep queue overhead negligible. A third thread flushes written data to disk
    every few tens of MiB, so the fsync before the final rename has little left to do.
    ``offset``/``digest`` on the transfer advance only after bytes are written, so they
    always describe the partial file exactly.
    """

    def __init__(self, transfer: Transfer, f: BinaryIO, write: Callable[[BinaryIO, bytes], None]) -> None:
        self.transfer, self.f, self.write = transfer, f, write
        self.error: OSError | None = None
        self.queue: queue.Queue[list[bytes] | None] = queue.Queue(maxsize=16)
        self.dirty, self.stopping = threading.Event(), False
        self.writer = threading.Thread(target=self._write_loop, name="localrun-download-writer", daemon=True)
        self.syncer = threading.Thread(target=self._sync_loop, name="localrun-download-sync", daemon=True)
        self.writer.start()
        self.syncer.start()

    def put(self, batch: list[bytes]) -> None:
        if self.error is not None:
            raise self.error
        if batch:
            self.queue.put(batch)

    def close(self, last: list[bytes]) -> None:
        if last and self.error is None:
            self.queue.put(last)
        self.queue.put(None)
        self.writer.join()
        self.stopping = True
        self.dirty.set()
        self.syncer.join()
        if self.error is not None:
            raise self.error

    def _write_loop(self) -> None:
        t, unsynced = self.transfer, 0
        while (batch := self.queue.get()) is not None:
            if self.error is not None:
                continue  # drain so the reader never blocks on a full queue
            try:
                data = batch[0] if len(batch) == 1 else b"".join(batch)  # one write, one hash: fewer GIL handoffs
                self.write(self.f, data)
                t.digest.update(data)
                t.offset += len(data)
                t.fetched += len(data)
                unsynced += len(data)
                if unsynced >= _SYNC_EVERY:
                    self.f.flush()
                    self.dirty.set()
                    unsynced = 0
            except OSError as exc:
                self.error = exc

    def _sync_loop(self) -> None:
        sync = getattr(os, "fdatasync", os.fsync)
        while True:
            self.dirty.wait()
            self.dirty.clear()
            if self.stopping:
                return
            try:
                sync(self.f.fileno())
            except OSError as exc:  # reported like a failed write
                self.error = self.error or exc
