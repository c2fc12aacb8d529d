"""The disk tier's root folder, shared by every model and every localrun process using it.

``root/<key digest>/`` holds one :class:`~.kv_disk.StateKey`'s entries (``<token hash>.kv``,
format in kv_file.py) and ``key.json``, which says in words what the digest stands for (for
``localrun cache ls``; the tier never trusts it, each file's header carries the digest itself).
``root/.lock`` is the ``flock`` every eviction and ``clear`` holds, so two servers sharing the
root never both decide to delete, and the budget is counted over the whole root at once.
Writers rename finished files into place, so readers need no lock: they only have to tolerate
a file vanishing between listing and opening it.

This module needs neither a model nor llama.cpp: ``localrun cache ls/clear`` run on it alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localrun.jsonfile import NotAJsonObject, open_regular, read_json_object
from localrun.runtimes.llamacpp.cache import kv_file

log = logging.getLogger(__name__)

KEY_FILE = "key.json"
LOCK_FILE = ".lock"
SUFFIX = ".kv"
TEMP_PREFIX = ".tmp-"
#: A temp file whose writer (by the pid in its name) still runs is left alone unless it has not
#: been touched for this long: the pid may belong to an unrelated process by now.
TEMP_MAX_AGE_S = 3600.0
#: The default budget is this share of the disk space the cache could use (free + its own).
DEFAULT_SHARE = 0.10
DEFAULT_CAP = 32 << 30
#: Below this the default budget is 0 (tier off): a disk this full has no room worth using.
DEFAULT_MIN = 256 << 20


@dataclass(frozen=True)
class DiskEntry:
    """One stored prefix: its tokens (read from the header), file size and last use (mtime)."""

    path: Path
    tokens: tuple[int, ...]
    nbytes: int
    used_at: float
    kind: str
    model_name: str = ""


@dataclass(frozen=True)
class FileStat:
    path: Path
    size: int
    mtime: float


@contextlib.contextmanager
def root_lock(root: Path) -> Iterator[None]:
    """Hold ``root/.lock`` exclusively (every process using the root, every tier in this one)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: renames stay atomic, evictions may race
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def key_folders(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except FileNotFoundError:
        return []


def entry_files(folder: Path) -> list[FileStat]:
    """The finished entry files of one key folder with their size and mtime (files that vanish
    while listed are left out: another process evicted them)."""
    out = []
    try:
        it = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    for e in it:
        if e.name.endswith(SUFFIX) and not e.name.startswith("."):
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):  # a FIFO or folder under an entry's name is never an entry
                continue
            out.append(FileStat(Path(e.path), st.st_size, st.st_mtime))
    return out


def temp_name(name: str, seq: int) -> str:
    """A temp file name in the same folder as its entry, naming its writer's pid."""
    return f"{TEMP_PREFIX}{os.getpid()}-{seq}-{name}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    except OSError:  # pragma: no cover - platforms without signal 0
        return True
    return True


def sweep_temp(folder: Path, *, now: float | None = None) -> int:
    """Remove temp files whose writer is gone (its pid no longer runs) or that nobody has written
    for :data:`TEMP_MAX_AGE_S`; returns how many. A live writer's file is never touched."""
    now = time.time() if now is None else now
    removed = 0
    try:
        it = list(os.scandir(folder))
    except FileNotFoundError:
        return 0
    for e in it:
        if not e.name.startswith(TEMP_PREFIX):
            continue
        pid_text = e.name[len(TEMP_PREFIX) :].split("-", 1)[0]
        try:
            pid = int(pid_text)
            age = now - e.stat().st_mtime
        except (ValueError, FileNotFoundError):
            continue
        gone = pid != os.getpid() and not _pid_alive(pid)
        if gone or age > TEMP_MAX_AGE_S:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)
                removed += 1
                log.info("removed %s, left by a writer that is gone", e.path)
    return removed


def evict_for(root: Path, need: int, budget: int, *, keep: Path | None = None) -> bool:
    """Make room for ``need`` more bytes under ``budget`` over the whole root, least recently
    used first (a load refreshes an entry's mtime). Call with :func:`root_lock` held. False when
    even an empty root cannot take ``need`` bytes."""
    if need > budget:
        return False
    files = []
    for folder in key_folders(root):
        sweep_temp(folder)
        files.extend(entry_files(folder))
    used = sum(f.size for f in files)
    files.sort(key=lambda f: f.mtime)
    for f in files:
        if used + need <= budget:
            break
        if keep is not None and f.path == keep:
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f.path)
            log.debug("evicted %s (%d bytes)", f.path, f.size)
        used -= f.size
    return used + need <= budget


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on a folder
        pass
    finally:
        os.close(fd)


def write_key_file(folder: Path, info: dict[str, Any]) -> None:
    """Write ``key.json`` atomically unless it already says the same."""
    path = folder / KEY_FILE
    try:
        if read_json_object(path) == info:
            return
    except NotAJsonObject:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / temp_name(KEY_FILE, threading.get_ident())  # two tiers of one process may race here
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_key_file(folder: Path) -> dict[str, Any]:
    """A folder's ``key.json`` ({} when missing or unreadable: display only)."""
    try:
        return read_json_object(folder / KEY_FILE)
    except NotAJsonObject:
        return {}


def cache_bytes(root: Path) -> int:
    return sum(f.size for folder in key_folders(root) for f in entry_files(folder))


def default_budget(root: Path) -> int:
    """The disk tier's budget when ``cache.kv_disk_bytes`` is unset: 10 % of what the cache could
    use (the free space plus what it already holds, so the number does not shrink as the cache
    fills), at most 32 GiB, and 0 (off) when that is under 256 MiB.

    Why: a 16k-token agent prefix is 0.3 GB for Gemma 3 270M and about 2 GB for an 8B model with
    an f16 cache, so 32 GiB keeps a working set of agent prompts for several models, while 10 %
    leaves a small disk nearly as free as it was.
    """
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return 0
    share = int(DEFAULT_SHARE * (free + cache_bytes(root)))
    budget = min(share, DEFAULT_CAP)
    return budget if budget >= DEFAULT_MIN else 0


def disk_room(folder: Path, need: int) -> bool:
    """Whether writing ``need`` bytes leaves the disk at least 1 GiB and 2 % free: the budget is
    a ceiling, and the cache never fills a disk that other things are filling too."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return False
    return usage.free - need >= max(1 << 30, usage.total // 50)


def read_entry_header(path: Path, digest: bytes) -> tuple[kv_file.Header, tuple[int, ...], os.stat_result]:
    """Open one entry file and check its header and tokens.

    Raises:
        FileNotFoundError: it vanished (evicted by another process).
        kv_file.BadFile: it failed a check.
    """
    with open_regular(path) as f:  # a FIFO, device or folder is refused, never waited on
        st = os.fstat(f.fileno())
        header, tokens = kv_file.read_header(f, size=st.st_size, digest=digest)
    return header, tokens, st


def list_entries(root: Path) -> list[DiskEntry]:
    """Every key's entries under ``root`` (headers and tokens only; no model or llama.cpp needed).
    Files that fail their checks are left out, not deleted: listing changes nothing."""
    out = []
    for folder in key_folders(Path(root)):
        try:
            digest = bytes.fromhex(folder.name)
        except ValueError:
            continue
        name = str(read_key_file(folder).get("model_name") or "")
        for f in entry_files(folder):
            try:
                header, tokens, st = read_entry_header(f.path, digest)
            except (FileNotFoundError, kv_file.BadFile, OSError):
                continue
            out.append(DiskEntry(f.path, tokens, st.st_size, st.st_mtime, header.kind, name))
    return out


def clear(root: Path, model_name: str | None = None) -> tuple[int, int]:
    """Remove every key's files, or those of the keys whose model is ``model_name`` (a model
    name, or the first 8 or more hex digits of a key digest); returns (files, bytes) removed."""
    root = Path(root)
    files = nbytes = 0
    if not root.exists():
        return 0, 0
    with root_lock(root):
        for folder in key_folders(root):
            if model_name is not None and not _matches(folder, model_name):
                continue
            for path in list(folder.iterdir()):
                with contextlib.suppress(FileNotFoundError):
                    st = path.lstat()
                    if stat.S_ISDIR(st.st_mode):  # not a cache file: left where it is, and said so
                        log.warning("cache clear: left %s, a folder localrun did not put there", path)
                        continue
                    size = st.st_size
                    path.unlink()
                    if path.name != KEY_FILE:
                        files += 1
                        nbytes += size
            with contextlib.suppress(OSError):
                folder.rmdir()
    return files, nbytes


def _matches(folder: Path, name: str) -> bool:
    if read_key_file(folder).get("model_name") == name:
        return True
    return len(name) >= 8 and folder.name.startswith(name.lower())
