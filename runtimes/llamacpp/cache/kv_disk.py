"""The prefix cache's disk tier: state blobs of cached prefixes kept in files across restarts,
unloads and model swaps (docs/kv-cache.md).

A :class:`DiskTier` serves one :class:`StateKey`: everything that shapes a state blob (the model
file's sha256, the runtime and llama.cpp build, the context parameters). Its entries live in
``root/<key digest>/``, one file per token prefix (format: kv_file.py; the root: kv_root.py).
A file made under any other key, or damaged in any way, is refused, deleted and counted as a
miss; the caller prefills instead, so a bad file costs time, never a wrong answer.

Writes never stall decoding: :meth:`DiskTier.put` only queues the blob (bounded by bytes;
``False`` rather than wait) and one background thread, at lowered CPU priority, writes it in
chunks to a temp file, fsyncs it, then under the root's lock evicts the least recently used
entries of the whole root until the budget holds and renames the file into place. A kill at
any point leaves either the old state or the whole new file, plus at most one temp file that a
later sweep removes once its writer is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localrun.jsonfile import open_regular
from localrun.runtimes.llamacpp.cache import kv_file, kv_root
from localrun.runtimes.llamacpp.cache.kv_root import DiskEntry, clear, default_budget, list_entries
from localrun.runtimes.llamacpp.cache.state_memory import nice_this_thread

__all__ = ["DiskEntry", "DiskTier", "StateKey", "clear", "default_budget", "list_entries"]

log = logging.getLogger(__name__)

#: Until a load has measured it, the tier assumes a read speed of 200 MB/s: a spinning disk's
#: sequential read, the slowest storage a cache folder is likely on. It errs towards prefilling
#: on fast machines until the first real load corrects it (SSDs and the page cache are faster).
DEFAULT_READ_BYTES_PER_S = 200e6
#: Loads smaller than this are not timed: their time is mostly open/stat, not throughput.
MEASURE_MIN_BYTES = 1 << 20
#: Weight of the newest measurement in the smoothed read speed.
SMOOTHING = 0.3
#: Queued (not yet written) blobs held at most, beyond the first (which is always taken).
DEFAULT_QUEUE_BYTES = 1 << 30
#: How much nicer than the process the writer thread runs on Linux, under ``SCHED_IDLE``
#: (state_memory.nice_this_thread): decoding threads win the CPU whenever they want it, and the
#: writer takes what they leave.
WRITER_NICE = 10


@dataclass(frozen=True)
class StateKey:
    """Everything that shapes a state blob; any difference is another key (another folder)."""

    model_sha256: str
    """The model file's sha256 (the store's record); "" means no key: the tier is off."""
    runtime: str
    """llama-cpp-python's version and llama.cpp's build (runtimes/llamacpp/build_info.py)."""
    params: tuple[tuple[str, str], ...]
    """(name, value) of every context parameter in the state's shape: type_k, type_v, n_ctx_seq,
    n_swa, rope freq base/scale, n_embd, n_layer, flags (full or partial state)…"""
    model_name: str = ""
    """For display only (``localrun cache ls``); not part of the identity."""

    def digest(self) -> str:
        """Hex sha256 of the identity fields, the same in every process and on every machine."""
        ident = {"model_sha256": self.model_sha256, "runtime": self.runtime, "params": sorted(self.params)}
        return hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        """What ``key.json`` says about the folder, for people and ``localrun cache ls``."""
        return {
            "digest": self.digest(),
            "format": kv_file.FORMAT_VERSION,
            "model_name": self.model_name,
            "model_sha256": self.model_sha256,
            "runtime": self.runtime,
            "params": dict(sorted(self.params)),
        }


@dataclass
class _Job:
    name: str
    tokens: tuple[int, ...]
    blob: bytes | bytearray | mmap.mmap  # never a view: put copies one
    kind: str
    size: int


def entry_name(tokens: Sequence[int], kind: str) -> str:
    """The file name of an entry: a hash of its tokens (so equal prefixes share one file)."""
    h = hashlib.blake2b(kv_file.token_bytes(tokens), digest_size=16).hexdigest()
    return f"{h}{'' if kind == 'prefix' else '-' + kind[0]}{kv_root.SUFFIX}"


class DiskTier:
    """One key's entries under a root shared with other keys and processes (see the module doc).

    Thread-safe: the scheduler thread calls entries/load/put, the writer thread writes, and
    ``counters`` may be read from anywhere.
    """

    def __init__(self, root: Path, key: StateKey, *, budget_bytes: int, queue_bytes: int = DEFAULT_QUEUE_BYTES):
        self.root = Path(root)
        self.key = key
        self.budget_bytes = max(0, int(budget_bytes))
        self.queue_bytes = queue_bytes
        self.folder = self.root / key.digest()
        self.read_bytes_per_s = DEFAULT_READ_BYTES_PER_S
        self.measured_read_bytes_per_s: float | None = None  # the latest load's own speed
        self._digest = bytes.fromhex(key.digest())
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[_Job] = deque()
        self._queued_bytes = 0
        self._writing = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.writer_tid: int | None = None
        self._seq = 0
        self._headers: dict[tuple[str, int, int], tuple[kv_file.Header, tuple[int, ...]]] = {}
        self._counts = dict.fromkeys(("hits", "misses", "read_bytes", "written_bytes", "dropped", "corrupt"), 0)
        self._last = {"entries": 0, "bytes": 0, "tokens": 0}
        self.enabled = bool(key.model_sha256) and self.budget_bytes > 0
        if self.enabled:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                kv_root.write_key_file(self.folder, key.describe())
                kv_root.sweep_temp(self.folder)
            except OSError as exc:
                log.warning("prompt cache on disk is off: cannot use %s (%s)", self.folder, exc)
                self.enabled = False

    # -- reading ---------------------------------------------------------------------------------

    def entries(self) -> list[DiskEntry]:
        """This key's entries, headers and tokens checked (blobs are checked by :meth:`load`).
        Bad files found here are deleted and counted as misses."""
        if not self.enabled:
            return []
        out = []
        seen = set()
        for f in kv_root.entry_files(self.folder):
            try:
                st = f.path.stat()
                cache_key = (f.path.name, st.st_ino, st.st_size)
                parsed = self._headers.get(cache_key)
                if parsed is None:
                    header, tokens, st = kv_root.read_entry_header(f.path, self._digest)
                    parsed = self._headers[cache_key] = (header, tokens)
            except FileNotFoundError:
                continue
            except (kv_file.BadFile, OSError) as exc:
                self._bad(f.path, exc)
                continue
            seen.add(cache_key)
            header, tokens = parsed
            out.append(DiskEntry(f.path, tokens, st.st_size, st.st_mtime, header.kind, self.key.model_name))
        self._headers = {k: v for k, v in self._headers.items() if k in seen}
        with self._lock:
            self._last = {
                "entries": len(out),
                "bytes": sum(e.nbytes for e in out),
                "tokens": sum(len(e.tokens) for e in out),
            }
        return out

    def load(self, entry: DiskEntry) -> memoryview | None:
        """The entry's blob, every check passed; None (and the file deleted if bad) otherwise.
        A load refreshes the entry's place in the LRU order."""
        if not self.enabled:
            return None
        start = time.perf_counter()
        try:
            with open_regular(entry.path) as f:  # a FIFO planted here must not block the load
                st = os.fstat(f.fileno())
                header, tokens = kv_file.read_header(f, size=st.st_size, digest=self._digest)
                if tokens != tuple(entry.tokens):
                    raise kv_file.BadFile("holds other tokens than its name says")
                blob = kv_file.read_blob(f, header)
        except FileNotFoundError:
            log.debug("%s vanished before it was read (evicted elsewhere)", entry.path)
            self._count("misses")
            return None
        except (kv_file.BadFile, OSError) as exc:
            self._bad(entry.path, exc)
            return None
        elapsed = time.perf_counter() - start
        with contextlib.suppress(OSError):
            os.utime(entry.path)
        with self._lock:
            self._counts["hits"] += 1
            self._counts["read_bytes"] += st.st_size
            if st.st_size >= MEASURE_MIN_BYTES and elapsed > 0:
                self.measured_read_bytes_per_s = speed = st.st_size / elapsed
                if self.read_bytes_per_s == DEFAULT_READ_BYTES_PER_S:  # a guess: the first measurement replaces it
                    self.read_bytes_per_s = speed
                else:  # measured before, or a prior the caller kept from an earlier run: smooth
                    self.read_bytes_per_s += SMOOTHING * (speed - self.read_bytes_per_s)
        return blob

    def discard(self, entry: DiskEntry) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)

    def _bad(self, path: Path, exc: BaseException) -> None:
        log.warning("prompt cache: ignored and removed %s: %s", path, exc)
        with contextlib.suppress(OSError):
            os.unlink(path)
        with self._lock:
            self._counts["misses"] += 1
            self._counts["corrupt"] += 1

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    # -- writing ---------------------------------------------------------------------------------

    def put(self, tokens: Sequence[int], blob: kv_file.Blob, *, kind: str = "prefix") -> bool:
        """Queue ``blob`` (the state of ``tokens``) for the writer thread and return at once.
        True: queued, or already stored or queued under the same tokens. False: dropped (tier off,
        larger than the budget, or the queue is full)."""
        if kind not in kv_file.KINDS:
            raise ValueError(f"kind must be one of {kv_file.KINDS}, not {kind!r}")
        if not self.enabled or not tokens:
            return False
        tokens = tuple(int(t) for t in tokens)
        if isinstance(blob, memoryview):
            blob = bytes(blob)  # a view into someone's buffer may change under us
        # bytes, or a buffer llama.cpp saved into (slots.read_state) that the caller hands over and
        # never writes again: copying it would cost the scheduler thread what read_state saved
        size = kv_file.HEADER_SIZE + 4 * len(tokens) + len(blob)
        name = entry_name(tokens, kind)
        with self._lock:
            if self._closed:
                return False
            if any(job.name == name for job in self._queue):
                return True
            queue_full = self._queue and self._queued_bytes + size > self.queue_bytes
            if size > self.budget_bytes or queue_full:
                self._counts["dropped"] += 1
                return False
            self._queue.append(_Job(name, tokens, blob, kind, size))
            self._queued_bytes += size
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="kv-disk-writer", daemon=True)
                self._thread.start()
            self._wake.notify_all()
        return True

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued write is on disk (or dropped), at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._queue or self._writing:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("prompt cache: %d writes still queued after %.0f s", len(self._queue), timeout_s)
                    return
                self._wake.wait(left)

    def close(self) -> None:
        """Flush, then stop the writer; later puts are dropped."""
        self.flush()
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5)

    def counters(self) -> dict[str, int]:
        """hits, misses, read_bytes, written_bytes, dropped, corrupt, and this key's entries,
        bytes and tokens as of the last :meth:`entries`."""
        with self._lock:
            return {**self._counts, **self._last}

    def _writer(self) -> None:
        self.writer_tid = threading.get_native_id()
        nice_this_thread(WRITER_NICE, idle=True)
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                job = self._queue[0]
                self._writing = True
            try:
                outcome = self._write(job)
            except OSError as exc:  # a full disk, a `cache clear` racing the rename: drop, go on
                log.warning("prompt cache: could not write %s: %s", self.folder / job.name, exc)
                outcome = "dropped"
            except Exception:  # the thread must outlive any one bad write
                log.exception("prompt cache: writing %s failed", job.name)
                outcome = "dropped"
            with self._lock:
                self._queue.popleft()
                self._queued_bytes -= job.size
                self._writing = False
                if outcome == "written":
                    self._counts["written_bytes"] += job.size
                elif outcome == "dropped":
                    self._counts["dropped"] += 1
                self._wake.notify_all()

    def _write(self, job: _Job) -> str:
        """Write one entry: temp file, fsync, evict under the root lock, rename, fsync the folder.
        Returns "written", "exists" (the same tokens are stored already) or "dropped"."""
        final = self.folder / job.name
        if final.exists():
            with contextlib.suppress(OSError):
                os.utime(final)  # stored again: it is in use
            return "exists"
        self.folder.mkdir(parents=True, exist_ok=True)
        if not kv_root.disk_room(self.folder, job.size):
            log.info("prompt cache: not writing %d bytes, the disk is nearly full", job.size)
            return "dropped"
        self._seq += 1
        tmp = self.folder / kv_root.temp_name(job.name, self._seq)
        try:
            self._write_file(tmp, job)
            with kv_root.root_lock(self.root):
                if not kv_root.evict_for(self.root, job.size, self.budget_bytes):
                    return "dropped"
                kv_root.write_key_file(self.folder, self.key.describe())  # `cache clear` may have taken it
                os.replace(tmp, final)
                kv_root.fsync_dir(self.folder)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        log.debug("prompt cache: wrote %s (%d tokens, %d bytes)", final, len(job.tokens), job.size)
        return "written"

    def _write_file(self, tmp: Path, job: _Job) -> None:
        toks = kv_file.token_bytes(job.tokens)
        head = kv_file.encode_header(
            self._digest, job.kind, toks, len(job.blob), kv_file.blob_crc(job.blob), time.time()
        )
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, head)
            view = memoryview(job.blob)
            for i in range(0, len(view), kv_file.CHUNK):
                _write_all(fd, view[i : i + kv_file.CHUNK])
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
