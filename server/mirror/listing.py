"""What the mirror answers about its repos: the :class:`Mirror` (the store's catalog, the verifier
and the optional upstream) and the bodies of ``/api/models``' listing, info, tree and refs, in the
hub's shapes. The routes that serve them are in :mod:`.routes`."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
from starlette.requests import Request

from localrun.errors import LocalrunError
from localrun.modelstore.gitids import lfs_pointer
from localrun.modelstore.hub import FORMAT_TAGS, hub_cache_dir
from localrun.modelstore.hub_catalog import (
    MirrorCommit,
    MirrorFile,
    MirrorRepo,
    StatKey,
    StoreCatalog,
    Verifier,
    tree_oid,
)

if TYPE_CHECKING:
    from localrun.modelstore.store import ModelStore
    from localrun.server.mirror.pull_through import Upstream

logger = logging.getLogger(__name__)

_MAX_LIST = 1000


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts or 0, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class Mirror:
    """The catalog (rebuilt when the index changes), the verifier and the optional upstream."""

    def __init__(self, store: ModelStore, *, upstream: Upstream | None = None) -> None:
        self.store = store
        self.catalog = StoreCatalog(store, hub_cache_dir())
        self.verifier = Verifier()
        self.upstream = upstream

    def repos(self) -> dict[str, MirrorRepo]:
        return self.catalog.repos()

    async def lookup(self, repo_id: str, revision: str) -> tuple[MirrorRepo | None, MirrorCommit | None]:
        """The local repo and commit; through the upstream when the store lacks them."""
        repo = self.repos().get(repo_id)
        commit = repo.resolve(revision) if repo else None
        if commit is None and self.upstream is not None:
            found = await self.upstream.lookup(repo_id, revision)
            if found is not None:
                return found[0], found[1]
        return repo, commit

    async def sha256(self, f: MirrorFile) -> str:
        """The file's sha256, hashing it (once, in a thread) when nothing recorded it."""
        known = self.verifier.sha256(f)
        if known:
            return known
        await self.verified(f)
        return self.verifier.sha256(f) or ""

    async def verified(self, f: MirrorFile) -> StatKey:
        """The stat key at which ``f`` is good now; hashes first if it changed. Raises VerificationFailed."""
        if self.upstream is not None:
            await self.upstream.ensure_local(f, self.verifier)
        key = self.verifier.good_key(f)
        if key is None:
            key = await anyio.to_thread.run_sync(self.verifier.verify, f)
        return key


async def info(mirror: Mirror, repo: MirrorRepo, commit: MirrorCommit, blobs: bool) -> dict[str, Any]:
    siblings = []
    for f in sorted(commit.files.values(), key=lambda f: f.path):
        item: dict[str, Any] = {"rfilename": f.path}
        if blobs and f.lfs:
            sha = await mirror.sha256(f)
            item.update(size=f.size, blobId=tree_oid(f, sha))
            item["lfs"] = {"size": f.size, "sha256": sha, "pointerSize": len(lfs_pointer(sha, f.size))}
        elif blobs:
            item.update(size=f.size, blobId=tree_oid(f, None))
        siblings.append(item)
    ns = repo.repo.split("/")[0]
    return {
        "_id": commit.commit[:24],
        "id": repo.repo,
        "modelId": repo.repo,
        "author": ns,
        "sha": commit.commit,
        "lastModified": iso(commit.updated),
        "createdAt": iso(commit.updated),
        "private": False,
        "gated": False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": sorted(repo.tags),
        "library_name": next(iter(sorted(repo.tags)), None),
        "siblings": siblings,
    }


async def tree(mirror: Mirror, commit: MirrorCommit, prefix: str, recursive: bool) -> list[dict[str, Any]] | None:
    """Entries below ``prefix`` (a folder); None when no such folder exists."""
    base = prefix + "/" if prefix else ""
    files: list[MirrorFile] = []
    folders: set[str] = set()
    for f in sorted(commit.files.values(), key=lambda f: f.path):
        if not f.path.startswith(base):
            continue
        rest = f.path[len(base) :]
        parts = rest.split("/")
        for k in range(1, len(parts) if recursive else min(len(parts), 2)):
            folders.add(base + "/".join(parts[:k]))
        if recursive or len(parts) == 1:
            files.append(f)
    if prefix and not files and not folders:
        return None
    out: list[dict[str, Any]] = [
        {"type": "directory", "oid": hashlib.sha1(f"{commit.commit}\0{d}".encode()).hexdigest(), "size": 0, "path": d}
        for d in sorted(folders)
    ]
    for f in files:
        sha = await mirror.sha256(f) if f.lfs else None
        entry: dict[str, Any] = {"type": "file", "oid": tree_oid(f, sha), "size": f.size, "path": f.path}
        if sha is not None:  # an LFS file: its pointer's facts
            entry["lfs"] = {"oid": sha, "size": f.size, "pointerSize": len(lfs_pointer(sha, f.size))}
        out.append(entry)
    return out


def refs(repo: MirrorRepo, include_prs: bool) -> dict[str, Any]:
    branches = [
        {"name": b, "ref": f"refs/heads/{b}", "targetCommit": c}
        for b, c in sorted(repo.branches.items())
        if not b.startswith("refs/")
    ]
    out = {"branches": branches, "tags": [], "converts": []}
    if include_prs:
        out["pullRequests"] = [
            {"name": b.rsplit("/", 1)[-1], "ref": b, "targetCommit": c}
            for b, c in sorted(repo.branches.items())
            if b.startswith("refs/pr/")
        ]
    return out


def list_models(mirror: Mirror, request: Request) -> list[dict[str, Any]]:
    q = request.query_params
    search = (q.get("search") or "").lower()
    author = q.get("author")
    wanted = {t.lower() for t in q.getlist("filter") for t in t.split(",") if t}
    try:
        limit = max(0, min(int(q.get("limit") or _MAX_LIST), _MAX_LIST))
    except ValueError:
        limit = _MAX_LIST
    hits = []
    for repo in sorted(mirror.repos().values(), key=lambda r: (-r.updated, r.repo)):
        if search and search not in repo.repo.lower():
            continue
        if author and repo.repo.split("/")[0] != author:
            continue
        if wanted and not wanted <= repo.tags:
            continue
        main = repo.resolve("main") or next(iter(repo.commits.values()))
        hits.append(
            {
                "_id": main.commit[:24],
                "id": repo.repo,
                "modelId": repo.repo,
                "sha": main.commit,
                "downloads": 0,
                "likes": 0,
                "lastModified": iso(repo.updated),
                "createdAt": iso(repo.updated),
                "tags": sorted(repo.tags),
                "gated": False,
                "private": False,
                "library_name": next(iter(sorted(repo.tags)), None),
            }
        )
    return hits[:limit]


async def with_upstream_hits(upstream: Upstream, request: Request, hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Local repos first, then the upstream's (pull-through serves those too); upstream
    trouble leaves the local answer alone."""
    q = request.query_params
    tags = [t for t in q.getlist("filter") if t]
    fmt = next((f for f, tag in FORMAT_TAGS.items() if tag in tags), None)
    try:
        limit = max(1, min(int(q.get("limit") or 20), 100))
        found = await anyio.to_thread.run_sync(
            lambda: upstream.client.search(q.get("search") or "", format=fmt, limit=limit)
        )
    except (LocalrunError, ValueError) as exc:
        logger.warning("mirror: upstream search failed: %s", getattr(exc, "message", exc))
        return hits
    seen = {h["id"] for h in hits}
    extra = [
        {
            "id": r.name,
            "modelId": r.name,
            "downloads": r.downloads,
            "likes": r.likes,
            "tags": list(r.tags),
            "gated": r.gated,
            "private": False,
            "lastModified": iso(r.updated.timestamp() if r.updated else 0),
        }
        for r in found
        if r.name not in seen
    ]
    return (hits + extra)[: limit if q.get("limit") else None]
