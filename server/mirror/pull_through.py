"""``localrun mirror --upstream URL``: what the store lacks is fetched from another hub, kept, served.

One machine at the edge of the intranet can then feed the rest. The upstream's listing
(revision → commit, files with sizes, sha256 and git oids) is read through localrun's
:class:`~localrun.modelstore.hub.HubClient`, validated as every listing is, and kept for a
few minutes; a file is fetched with localrun's own downloader
(:func:`~localrun.modelstore.download.fetch_file`: resumable, hashed while streaming,
never at its final path before it matches), into this machine's HF cache, where it stays.

Concurrent requests for one missing file share one download: within this process an
asyncio future per blob, across processes the downloader's file lock. A HEAD is answered
from the listing alone and never waits for a download; a whole-file GET streams the bytes
as they arrive (:class:`~localrun.server.mirror.files.GrowingFile`), a Range GET waits. When the upstream cannot be
reached, what was fetched before is still served from the cache, found by revision.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import anyio

from localrun.errors import DownloadFailed, LocalrunError, ModelNotFound
from localrun.modelstore.hfcache import CacheLayout, listing_from_cache
from localrun.modelstore.hub import HubClient, RemoteFile, RepoListing, hub_cache_dir
from localrun.modelstore.hub_catalog import MirrorCommit, MirrorFile, MirrorRepo, Verifier
from localrun.settings import Settings

logger = logging.getLogger(__name__)

LISTING_TTL_S = 300.0


class Upstream:
    """Pull-through from one hub endpoint into this machine's HF cache."""

    def __init__(self, url: str, *, settings: Settings | None = None, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.client = HubClient(endpoint=self.url, token=token, settings=settings)
        self.cache_dir = hub_cache_dir()
        self._listings: dict[tuple[str, str], tuple[float, MirrorRepo, MirrorCommit]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._remote: dict[str, tuple[str, str, RemoteFile]] = {}  # blob path -> (repo, commit, listing entry)
        self._fetching: dict[str, asyncio.Future[str]] = {}
        self.fetches = 0  # files downloaded from the upstream (tests count them)

    async def lookup(self, repo_id: str, revision: str) -> tuple[MirrorRepo, MirrorCommit] | None:
        """The upstream's repo at ``revision`` (its listing, cached); None when it has none."""
        key = (repo_id, revision)
        hit = self._listings.get(key)
        if hit and time.monotonic() - hit[0] < LISTING_TTL_S:
            return hit[1], hit[2]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            hit = self._listings.get(key)
            if hit and time.monotonic() - hit[0] < LISTING_TTL_S:
                return hit[1], hit[2]
            listing, stale = await anyio.to_thread.run_sync(self._listing, repo_id, revision)
            if listing is None:
                return None
            found = self._as_repo(listing)
            if stale:
                found[0].warning = f"upstream {self.url} is unreachable; serving the copy this mirror fetched before"
            self._listings[key] = (time.monotonic(), *found)
            return found

    def _listing(self, repo_id: str, revision: str) -> tuple[RepoListing | None, bool]:
        """The upstream's listing, or (upstream down) the cache's; the flag says it is the cache's."""
        try:
            listing = self.client.list_repo(repo_id, revision)
        except ModelNotFound:
            return None, False
        except DownloadFailed as exc:
            logger.warning(
                "mirror: upstream %s unreachable for %s@%s (%s); serving what the cache holds",
                self.url,
                repo_id,
                revision,
                exc.message,
            )
            return self._cached_listing(repo_id, revision), True
        except LocalrunError as exc:
            logger.warning("mirror: upstream %s refused %s@%s: %s", self.url, repo_id, revision, exc.message)
            return None, False
        CacheLayout(self.cache_dir, repo_id).write_ref(revision, listing.commit)
        return listing, False

    def _cached_listing(self, repo_id: str, revision: str) -> RepoListing | None:
        try:
            return listing_from_cache(CacheLayout(self.cache_dir, repo_id), revision)
        except LocalrunError:
            return None

    def _as_repo(self, listing: RepoListing) -> tuple[MirrorRepo, MirrorCommit]:
        layout = CacheLayout(self.cache_dir, listing.repo)
        commit = MirrorCommit(listing.commit, updated=time.time())
        for rf in listing.files:
            if not rf.etag:
                continue  # nothing to verify it against: not served
            disk = str(layout.blob(rf.etag))
            commit.files[rf.path] = MirrorFile(rf.path, rf.size, disk, rf.sha256, None if rf.sha256 else rf.oid, None)
            self._remote[disk] = (listing.repo, listing.commit, rf)
        branches = {listing.revision: listing.commit} if listing.revision != listing.commit else {}
        repo = MirrorRepo(listing.repo, commits={listing.commit: commit}, branches=branches or {"main": listing.commit})
        return repo, commit

    def pending(self, f: MirrorFile) -> bool:
        """True for an upstream file not yet in this machine's cache."""
        return f.disk in self._remote and not os.path.exists(f.disk)

    def start_fetch(self, f: MirrorFile) -> asyncio.Future[str]:
        """The one download of ``f`` (started now unless it is running); resolves to its sha256."""
        fut = self._fetching.get(f.disk)
        if fut is None:
            fut = asyncio.ensure_future(anyio.to_thread.run_sync(self._fetch, f.disk))
            self._fetching[f.disk] = fut
            fut.add_done_callback(lambda _: self._fetching.pop(f.disk, None))
        return fut

    def expected(self, f: MirrorFile) -> RemoteFile:
        return self._remote[f.disk][2]

    async def ensure_local(self, f: MirrorFile, verifier: Verifier) -> None:
        """Download ``f`` from the upstream if it is one of its files and not here yet (once)."""
        if not self.pending(f):
            return
        sha256 = await asyncio.shield(self.start_fetch(f))
        verifier.trust(f, sha256)

    def _fetch(self, disk: str) -> str:
        from localrun.modelstore.download import fetch_file

        repo, commit, rf = self._remote[disk]
        layout = CacheLayout(self.cache_dir, repo)
        with self.client.deadlines.client() as http:
            result = fetch_file(
                layout,
                commit,
                rf,
                self.client.file_url(repo, commit, rf.path),
                client=http,
                headers=self.client.auth_headers(),
                deadlines=self.client.deadlines,
            )
        self.fetches += 0 if result.reused else 1
        logger.info("mirror: fetched %s/%s from %s (%d bytes)", repo, rf.path, self.url, result.fetched)
        return result.sha256
