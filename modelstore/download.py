"""The downloader: one file from the hub into the Hugging Face cache layout, verified.

Why not ``hf_hub_download``: it checks only a file's size, trusts any blob already in the
cache, and since 1.18 deletes its partial file on failure, so a killed multi-GB pull starts
over. This module keeps the layout (``blobs/<etag>`` + ``snapshots/<commit>/<path>``
relative symlinks + ``refs/<revision>``, the same ``.locks/`` lock files) so both tools see
and reuse each other's files, and adds what the layout lacks:

* a lock per file, so concurrent pulls of one file download it once;
* ``blobs/<etag>.incomplete`` kept across processes, resumed with ``Range`` after Ctrl-C or
  kill -9 (the bytes already there are hashed first, then the stream continues the hash);
* sha256 (LFS files) or git sha1 (small files) computed while streaming and checked before
  ``os.replace`` puts the blob at its final name: nothing unverified ever sits there;
* a blob found already in the cache is re-hashed before it is reused, never trusted blind.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from localrun.errors import AccessDenied, DownloadFailed, ModelNotFound
from localrun.modelstore.download_sink import Sink
from localrun.modelstore.gitids import git_blob_hasher
from localrun.modelstore.hfcache import CacheLayout
from localrun.modelstore.hub import RemoteFile
from localrun.modelstore.hub_http import RATE_HINT, Deadlines, RateFloor, after_headers, timeout_error

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

CHUNK_SIZE = 1024 * 1024
_BATCH = 1024 * 1024
RETRIES = 5
_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


@dataclass(frozen=True)
class Progress:
    """One progress report for one file. ``phase``: checking | waiting | downloading | done."""

    file: str
    done: int
    total: int
    speed: float = 0.0  # bytes/s over this transfer
    eta: float | None = None  # seconds left at that speed
    phase: str = "downloading"


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True)
class FetchResult:
    path: Path  # the snapshot path (a symlink into blobs/ where links work)
    blob: Path
    sha256: str
    size: int
    fetched: int  # bytes that came over the network for this file
    reused: bool  # the verified blob was already in the cache


class FileDigest:
    """sha256 always; git sha1 too when the listing gave only a git oid (non-LFS file)."""

    def __init__(self, rf: RemoteFile) -> None:
        self.rf = rf
        self.sha256 = hashlib.sha256()
        self.sha1 = None if rf.sha256 else git_blob_hasher(rf.size)

    def update(self, data: bytes) -> None:
        self.sha256.update(data)
        if self.sha1 is not None:
            self.sha1.update(data)

    def mismatch(self) -> str | None:
        """None when the bytes match the listing, else what was expected and what came."""
        if self.rf.sha256:
            got = self.sha256.hexdigest()
            return None if got == self.rf.sha256 else f"sha256 {got}, expected {self.rf.sha256}"
        if self.rf.oid and self.sha1 is not None:
            got = self.sha1.hexdigest()
            return None if got == self.rf.oid else f"git oid {got}, expected {self.rf.oid}"
        return None  # nothing to compare but the size, which the caller checked


def _write(f: BinaryIO, data: bytes) -> None:
    """The one place bytes hit the disk (tests inject ENOSPC here)."""
    f.write(data)


def hash_file(
    path: Path, rf: RemoteFile, limit: int | None, progress: ProgressCallback | None
) -> tuple[FileDigest, int]:
    digest, done = FileDigest(rf), 0
    with open(path, "rb") as f:
        while limit is None or done < limit:
            block = f.read(CHUNK_SIZE if limit is None else min(CHUNK_SIZE * 8, limit - done))
            if not block:
                break
            digest.update(block)
            done += len(block)
            if progress:
                progress(Progress(rf.path, done, rf.size, phase="checking"))
    return digest, done


def check_disk_space(folder: Path, need: int, what: str) -> None:
    free = shutil.disk_usage(folder).free
    if need > free:
        raise DownloadFailed(
            f"not enough disk space for {what}: need {need / 1e9:.2f} GB, {free / 1e9:.2f} GB free in {folder}",
            hint="free some space, or point HF_HUB_CACHE at a larger disk",
        )


class _Transfer:
    """Streams one file into its .incomplete, resuming and retrying; holds the running hash.

    State (``offset``, ``digest``) always describes exactly the bytes in the partial file,
    so a resume after any failure continues from a consistent point.
    """

    def __init__(
        self,
        client: httpx.Client,
        url: str,
        headers: dict[str, str],
        rf: RemoteFile,
        partial: Path,
        repo: str,
        progress: ProgressCallback | None,
        chunk_size: int | None,
        retries: int,
        digest: FileDigest,
        offset: int,
        deadlines: Deadlines | None = None,
    ) -> None:
        self.client, self.url, self.headers, self.rf, self.partial, self.repo = client, url, headers, rf, partial, repo
        self.progress, self.chunk_size, self.retries = progress, chunk_size, retries
        self.digest, self.offset, self.fetched = digest, offset, 0
        self.deadlines = deadlines or Deadlines()
        self.where = f"{repo}/{rf.path}"

    def restart(self) -> None:
        with open(self.partial, "wb"):
            pass
        self.digest, self.offset = FileDigest(self.rf), 0

    def run(self) -> None:
        import httpx

        attempt, began, began_at = 0, time.monotonic(), self.offset
        while self.offset < self.rf.size:
            headers = {**self.headers, "Accept-Encoding": "identity"}
            if self.offset:
                headers["Range"] = f"bytes={self.offset}-"
            at, got_headers, origin = self.offset, False, _origin(self.url)
            try:
                with self.client.stream("GET", self.url, headers=headers) as resp:
                    got_headers, origin = True, _origin(str(resp.url))  # after redirects: the host that went silent
                    after_headers(resp, self.deadlines)
                    if self._accept(resp):
                        self._receive(resp, began, began_at, origin)
                if self.offset < self.rf.size:
                    raise httpx.RemoteProtocolError("the body ended early")
            except httpx.TooManyRedirects as exc:  # a loop: asking again loops again
                raise DownloadFailed(
                    f"{self.where}: the hub redirected the download in a loop (or more than 20 times)",
                    hint="check that HF_ENDPOINT points at a Hugging Face hub or mirror",
                ) from exc
            except (httpx.TransportError, _Retry) as exc:
                if isinstance(exc, httpx.TimeoutException) and self.offset == at:
                    # Silence with nothing gained: asking again only multiplies the wait.
                    why = timeout_error(exc, origin, self.deadlines, body=got_headers)
                    raise DownloadFailed(
                        f"{self.where}: {why.message} ({self.offset} of {self.rf.size} bytes kept)", hint=why.hint
                    ) from exc
                attempt += 1
                if attempt > self.retries:
                    raise DownloadFailed(
                        f"{self.where}: download broke off at {self.offset} of {self.rf.size} bytes: {exc}",
                        hint="run the pull again: it resumes from the bytes already on disk",
                    ) from exc
                logger.info(
                    "%s: %s at byte %d, retrying (%d/%d)", self.rf.path, exc, self.offset, attempt, self.retries
                )
                time.sleep(min(0.2 * 2 ** (attempt - 1), 5.0))

    def _accept(self, resp: httpx.Response) -> bool:
        """Decide what a response means for the bytes we hold; False: nothing to read from it."""
        code = resp.status_code
        if code in (401, 403):
            raise AccessDenied(
                f"{self.where}: the hub refused the download ({code})",
                hint=(
                    "for a gated or private repo accept its terms on the hub, then run `hf auth login` or set HF_TOKEN"
                ),
            )
        if code == 404:
            raise ModelNotFound(
                f"{self.where}: the file is not on the hub at this revision",
                hint="list the repo again; it may have changed",
            )
        if code == 429 or code >= 500:
            raise _Retry(f"the hub answered {code}")
        if code == 416 and self.offset:
            logger.warning("%s: the hub refused a resume at %d; starting over", self.where, self.offset)
            self.restart()
            raise _Retry("range not satisfiable")
        if code == 206 and self.offset:
            m = _CONTENT_RANGE_RE.match(resp.headers.get("Content-Range", ""))
            if m and int(m[1]) == self.offset and m[3] in ("*", str(self.rf.size)):
                return True
            logger.warning(
                "%s: Content-Range %r does not continue byte %d; starting over",
                self.where,
                resp.headers.get("Content-Range"),
                self.offset,
            )
            self.restart()
            raise _Retry("inconsistent Content-Range")
        if code != 200:
            raise DownloadFailed(f"{self.where}: the hub answered {code}", hint="check HF_ENDPOINT and try again")
        if self.offset:
            logger.info("%s: the server ignored Range; starting over from byte 0", self.where)
            self.restart()
        return True

    def _receive(self, resp: httpx.Response, began: float, began_at: int, origin: str) -> None:
        last_report, size, received = 0.0, self.rf.size, self.offset
        floor = RateFloor(self.deadlines, time.monotonic(), received)
        try:
            with open(self.partial, "r+b" if self.partial.exists() else "wb") as f:
                f.seek(self.offset)
                sink = Sink(self, f, _write)  # looked up now: tests swap _write to fill the disk
                try:
                    batch, batched = [], 0
                    for chunk in resp.iter_raw(self.chunk_size):
                        received += len(chunk)
                        if received > size:
                            raise DownloadFailed(
                                f"{self.where}: the server sent more than the {size} bytes the listing gives",
                                hint="the mirror serves a different file; check HF_ENDPOINT",
                            )
                        batch.append(chunk)
                        batched += len(chunk)
                        if batched >= _BATCH:
                            sink.put(batch)
                            batch, batched = [], 0
                        now = time.monotonic()
                        slow = floor.too_slow(now, received)
                        if slow is not None:  # the finally below keeps what came, for the next pull
                            raise DownloadFailed(
                                f"{self.where}: the hub at {origin} {slow}; cut at {received:,} of {size:,} bytes",
                                hint=RATE_HINT,
                            )
                        if self.progress and now - last_report >= 0.1:
                            last_report = now
                            speed = (received - began_at) / max(now - began, 1e-6)
                            self.progress(
                                Progress(
                                    self.rf.path, received, size, speed, (size - received) / speed if speed else None
                                )
                            )
                finally:
                    sink.close(batch)  # bytes received before a failure are good: keep them
                if self.offset == size:
                    f.flush()
                    os.fsync(f.fileno())
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DownloadFailed(
                    f"disk full while writing {self.rf.path} ({self.offset} of {size} bytes kept)",
                    hint="free some space and pull again: it resumes where it stopped",
                ) from exc
            raise DownloadFailed(
                f"cannot write {self.partial}: {exc}", hint="check the cache folder's permissions"
            ) from exc


def _origin(url: str) -> str:
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return f"{u.scheme}://{u.netloc.rpartition('@')[2]}"


class _Retry(Exception):
    """A transient answer (429, 5xx, a confused range): back off and ask again."""


def fetch_file(
    layout: CacheLayout,
    commit: str,
    rf: RemoteFile,
    url: str,
    *,
    client: httpx.Client,
    headers: dict[str, str] | None = None,
    progress: ProgressCallback | None = None,
    chunk_size: int | None = None,
    retries: int = RETRIES,
    deadlines: Deadlines | None = None,
) -> FetchResult:
    """Make ``snapshots/<commit>/<rf.path>`` a verified copy of the hub's file and return it.

    ``chunk_size=None`` writes bytes as they arrive (no re-chunking copy, and nothing held
    in memory is lost when a connection breaks).

    Raises DownloadFailed (network, disk, hash mismatch), AccessDenied (401/403),
    ModelNotFound (404) or InvalidName (a name that would leave the cache).
    """
    from filelock import FileLock, Timeout

    blob = layout.blob(rf.etag)
    partial = blob.with_name(blob.name + ".incomplete")
    lock_path = layout.lock(rf.etag)
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    while True:
        try:
            lock.acquire(timeout=0.5)
            break
        except Timeout:
            if progress:
                progress(Progress(rf.path, 0, rf.size, phase="waiting"))
    try:
        if os.path.exists(blob):
            digest, size = hash_file(blob, rf, None, progress)
            if size == rf.size and digest.mismatch() is None:
                snap = layout.link(commit, rf.path, blob)
                if progress:
                    progress(Progress(rf.path, size, rf.size, phase="done"))
                return FetchResult(snap, blob, digest.sha256.hexdigest(), size, 0, True)
            logger.warning("%s: cached blob %s does not match the hub; fetching it again", rf.path, blob)
            blob.unlink()
        return _download(
            layout, commit, rf, url, blob, partial, client, headers or {}, progress, chunk_size, retries, deadlines
        )
    finally:
        lock.release()


def _download(
    layout: CacheLayout,
    commit: str,
    rf: RemoteFile,
    url: str,
    blob: Path,
    partial: Path,
    client: httpx.Client,
    headers: dict[str, str],
    progress: ProgressCallback | None,
    chunk_size: int | None,
    retries: int,
    deadlines: Deadlines | None = None,
) -> FetchResult:
    offset = partial.stat().st_size if partial.exists() else 0
    digest = FileDigest(rf)
    if offset > rf.size:
        partial.write_bytes(b"")
        offset = 0
    if offset:
        digest, offset = hash_file(partial, rf, offset, progress)
        logger.info("%s: resuming at byte %d of %d", rf.path, offset, rf.size)
    check_disk_space(blob.parent, rf.size - offset, rf.path)
    transfer = _Transfer(
        client, url, headers, rf, partial, layout.repo, progress, chunk_size, retries, digest, offset, deadlines
    )
    resumed = offset > 0
    while True:
        transfer.run()
        problem = transfer.digest.mismatch()
        if problem is None:
            break
        if resumed:  # the kept bytes may be the bad ones: one clean try from zero
            logger.warning("%s: resumed file does not verify (%s); starting over", rf.path, problem)
            resumed = False
            transfer.restart()
            continue
        partial.unlink(missing_ok=True)
        raise DownloadFailed(
            f"{layout.repo}/{rf.path}: the downloaded bytes do not match the hub's listing ({problem}); nothing was "
            "kept",
            hint="run the pull again; if it repeats, the mirror or a proxy is altering the file",
        )
    if not partial.exists():  # an empty file: nothing was streamed
        partial.touch()
    os.replace(partial, blob)
    snap = layout.link(commit, rf.path, blob)
    if progress:
        progress(Progress(rf.path, rf.size, rf.size, phase="done"))
    return FetchResult(snap, blob, transfer.digest.sha256.hexdigest(), rf.size, transfer.fetched, False)
