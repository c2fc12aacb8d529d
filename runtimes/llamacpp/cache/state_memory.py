"""Memory made ready, off the scheduler thread, for the states an idle slot will leave with.

When a newcomer evicts an idle slot, its state is copied out of llama.cpp
(``llama_state_seq_get_data``) on the scheduler thread, and every running stream waits for it.
The copy itself is fast; the pages it lands in are not. Memory a process has never touched
costs a page fault per page on first write, and on a VM the hypervisor adds its own. A 57 MB
Gemma state (16k tokens) took 0.10-0.13 s into fresh memory and 0.01-0.02 s into memory
written before, whatever the buffer (huge pages, plain mmap, bytearray).

So when a slot goes idle holding a prefix that would be saved on eviction, :class:`ReadyBuffers`
allocates and writes that many state-sized buffers on a thread of its own, niced like the disk
writer. The eviction's save takes one (:meth:`ReadyBuffers.take`) instead of fresh memory, and
the pool shrinks it to the bytes llama.cpp wrote. The pool holds at most ``max_bytes``
(:func:`default_max_bytes`: a twentieth of the RAM available at load, at most 1 GiB). A slot
whose states do not fit gets no buffers and saves into fresh memory, as before. An 8B model's
16k-token state is about 2 GB, and its decode step is slow enough that the fault time matters
less. A slot evicted, cleared or dropped takes its buffers with it (:meth:`forget`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import sys
import threading
from collections.abc import Callable
from typing import cast

from localrun.runtimes.llamacpp.cache import kv_file

log = logging.getLogger(__name__)

#: The most a pool holds, whatever the RAM.
MAX_BYTES = 1 << 30
#: Of the RAM available at load, the share a pool may hold.
RAM_SHARE = 20
#: Headroom over the state's size now: the next turns grow it, and a buffer too small is remade.
HEADROOM = 8  # one eighth
#: Buffers are whole huge pages.
ALIGN = 2 << 20
#: How much nicer than the process the filling thread runs on Linux (as the disk writer).
FILL_NICE = 10


def default_max_bytes() -> int:
    try:
        import psutil

        return min(MAX_BYTES, psutil.virtual_memory().available // RAM_SHARE)
    except (ImportError, OSError):
        return 0


def nice_this_thread(delta: int, *, idle: bool = False) -> None:
    """Lower the calling thread's priority on Linux, where both are per thread (nothing elsewhere):
    its nice value ``delta`` above the process's (relative: a niced server stays below), and with
    ``idle`` the ``SCHED_IDLE`` policy too, a core only when nothing else wants one.

    The disk writer runs idle: at nice 10 alone its page-cache copies of a 114 MB eviction still
    took slices from llama.cpp's two threads on two cores, whose every step waits for both.
    The buffers' filling thread is only niced: it must finish before the slot is evicted."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + delta))
    if idle:
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))


def shrink(buf: kv_file.Blob, size: int) -> kv_file.Blob:
    """``buf`` cut to its first ``size`` bytes: in place where the OS can (a bytearray; an
    anonymous mmap on Linux, mremap), else a copy."""
    if len(buf) == size:
        return buf
    if isinstance(buf, bytearray):
        del buf[size:]
        return buf
    if isinstance(buf, mmap.mmap):
        with contextlib.suppress(OSError, SystemError, ValueError, BufferError):
            buf.resize(size)
            return buf
    return bytes(memoryview(buf)[:size])


def _touch(buf: bytearray | mmap.mmap) -> None:
    """Write every page of ``buf`` (a memset, outside the GIL), so a later write faults none."""
    view = (ctypes.c_char * len(buf)).from_buffer(buf)
    try:
        ctypes.memset(view, 0, len(buf))
    finally:
        del view


class ReadyBuffers:
    """Touched buffers for the states idle slots would leave with; see the module docstring.

    ``size_of(seq)`` is a sequence's full state size (llama.cpp sizes it without copying); it is
    called on the thread that calls :meth:`want`, the scheduler's."""

    def __init__(self, max_bytes: int, size_of: Callable[[int], int]) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._size_of = size_of
        self._lock = threading.Condition()
        self._wanted: dict[int, tuple[int, int, int]] = {}  # seq -> (count, state bytes, buffer bytes)
        self._ready: dict[int, list[bytearray | mmap.mmap]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self.filled = self.taken = 0

    @property
    def ready_bytes(self) -> int:
        with self._lock:
            return self._held()

    def _held(self) -> int:
        return sum(len(b) for bufs in self._ready.values() for b in bufs)

    def want(self, seq: int, count: int) -> None:
        """Have ``count`` buffers ready for ``seq``'s states (0: none), each as big as its whole
        state now and some headroom; those already ready and big enough stay."""
        size = self._size_of(seq) if count > 0 and self.max_bytes else 0
        each = -(-(size + size // HEADROOM) // ALIGN) * ALIGN
        if size < kv_file.CHUNK or count * each > self.max_bytes:
            self.forget(seq)
            return
        with self._lock:
            if self._closed:
                return
            self._wanted[seq] = (count, size, each)
            ready = [b for b in self._ready.get(seq, ()) if len(b) >= size][:count]
            self._ready[seq] = ready
            if self._thread is None:
                self._thread = threading.Thread(target=self._fill, name="kv-buffers", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def forget(self, seq: int) -> None:
        with self._lock:
            self._wanted.pop(seq, None)
            self._ready.pop(seq, None)
            self._lock.notify_all()

    def take(self, size: int) -> bytearray | mmap.mmap | None:
        """The smallest ready buffer of at least ``size`` bytes (it leaves the pool), or None."""
        with self._lock:
            best: tuple[int, int] | None = None
            for seq, bufs in self._ready.items():
                for i, b in enumerate(bufs):
                    if len(b) >= size and (best is None or len(b) < len(self._ready[best[0]][best[1]])):
                        best = (seq, i)
            if best is None:
                return None
            self.taken += 1
            buf = self._ready[best[0]].pop(best[1])
            self._lock.notify_all()
            return buf

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wanted.clear()
            self._ready.clear()
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5)

    def _next(self) -> tuple[int, int, int] | None:
        """A (seq, state bytes, buffer bytes) still short of buffers that fits the budget."""
        held = self._held()
        for seq, (count, size, each) in self._wanted.items():
            if len(self._ready.get(seq, ())) < count and held + each <= self.max_bytes:
                return seq, size, each
        return None

    def _fill(self) -> None:
        nice_this_thread(FILL_NICE)
        while True:
            with self._lock:
                job: tuple[int, int, int] | None = None
                while not self._closed and (job := self._next()) is None:
                    self._lock.wait()
                if self._closed:
                    return
            seq, size, each = cast(tuple[int, int, int], job)  # not closed: the loop left with a job
            buf = kv_file.blob_buffer(each)
            _touch(buf)
            with self._lock:
                wanted = self._wanted.get(seq)
                ready = self._ready.setdefault(seq, [])
                if not self._closed and wanted is not None and wanted[1] <= each and len(ready) < wanted[0]:
                    ready.append(buf)
                    self.filled += 1
