"""One repo's folder in the Hugging Face hub cache, the layout huggingface_hub and llama.cpp share.

    <cache>/models--org--name/refs/<revision>              the commit a branch or tag was at
    <cache>/models--org--name/blobs/<etag>                 sha256 (LFS) or git sha1 (small files)
    <cache>/models--org--name/snapshots/<commit>/<path>    relative symlink -> ../../blobs/<etag>
    <cache>/.locks/models--org--name/<etag>.lock           the lock huggingface_hub takes too

Every path handed out goes through :func:`~localrun.modelstore.names.safe_join`, so a
name from a listing, a revision, or a symlink planted in the cache cannot lead outside it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from pathlib import Path

from localrun.errors import InvalidName, ModelNotFound
from localrun.jsonfile import read_regular
from localrun.modelstore.hub import RemoteFile, RepoListing
from localrun.modelstore.names import safe_join, safe_relpath

logger = logging.getLogger(__name__)

_ETAG_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


class CacheLayout:
    """One repo's folder in the HF cache; every path it hands out is proven inside the cache."""

    def __init__(self, cache_dir: str | Path, repo: str) -> None:
        self.cache_dir = Path(cache_dir)
        self.repo = repo
        self.folder_name = "models--" + repo.replace("/", "--")
        safe_relpath(self.folder_name)

    @property
    def folder(self) -> Path:
        return self.cache_dir / self.folder_name

    def _inside(self, rel: str) -> Path:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        return safe_join(self.cache_dir, f"{self.folder_name}/{rel}")

    def blob(self, etag: str) -> Path:
        if not _ETAG_RE.match(etag):
            raise InvalidName(f"{self.repo}: invalid blob id {etag[:80]!r}")
        return self._inside(f"blobs/{etag}")

    def snapshot(self, commit: str, path: str) -> Path:
        return self._inside(f"snapshots/{commit}/{safe_relpath(path)}")

    def snapshot_dir(self, commit: str) -> Path:
        return self._inside(f"snapshots/{commit}")

    def lock(self, etag: str) -> Path:
        return safe_join(self.cache_dir, f".locks/{self.folder_name}/{etag}.lock")

    def read_ref(self, revision: str) -> str | None:
        try:
            # A FIFO here blocked every pull and load that read it; a ref is 40 hex digits.
            value = read_regular(self._inside(f"refs/{safe_relpath(revision)}"), max_bytes=256).decode().strip()
        except (OSError, UnicodeDecodeError):
            return None
        return value if re.fullmatch(r"[0-9a-f]{40}", value) else None

    def write_ref(self, revision: str, commit: str) -> None:
        """refs/<revision> names the commit a branch or tag was at, as huggingface_hub does."""
        if revision == commit:
            return
        path = self._inside(f"refs/{safe_relpath(revision)}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, path)

    def link(self, commit: str, path: str, blob: Path) -> Path:
        """Point snapshots/<commit>/<path> at the blob (relative symlink; a copy where links fail)."""
        snap = self.snapshot(commit, path)
        snap.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(snap):
            if snap.is_dir() and not snap.is_symlink():
                raise InvalidName(f"{self.repo}: {path!r} is a folder in the cache, not a file")
            if snap.exists() and os.path.samefile(snap, blob):
                return snap
        tmp = snap.with_name(f".{snap.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            os.symlink(os.path.relpath(blob, snap.parent), tmp)
        except OSError:  # Windows without symlink rights: huggingface_hub copies too
            shutil.copyfile(blob, tmp)
        os.replace(tmp, snap)
        return snap


def listing_from_cache(layout: CacheLayout, revision: str | None) -> RepoListing:
    """What the cache holds for the layout's repo at ``revision`` (default ``main``), in the shape
    of a hub listing: offline pulls plan from it, and a pull-through mirror serves it when its
    upstream is down. Etags are read from the snapshot links, so no byte is hashed here.

    Raises:
        ModelNotFound: the revision or its snapshot is not in the cache.
    """
    repo = layout.repo
    rev = revision or "main"
    commit = rev if re.fullmatch(r"[0-9a-f]{40}", rev) else layout.read_ref(rev)
    where = f"the local cache ({layout.cache_dir})"
    if commit is None or not layout.snapshot_dir(commit).is_dir():
        raise ModelNotFound(
            f"offline: {repo}@{rev} is not in {where}",
            hint="connect and pull it first, or unset HF_HUB_OFFLINE / drop --offline",
        )
    root = layout.snapshot_dir(commit)
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not Path(dirpath, d).is_symlink()]
        for fn in filenames:
            full = Path(dirpath, fn)
            rel = full.relative_to(root).as_posix()
            if not full.exists():
                continue  # a dangling link: treated as missing
            etag = os.path.basename(os.readlink(full)) if full.is_symlink() else ""
            etag = etag if _ETAG_RE.match(etag) else ""
            sha256, oid = (etag, None) if len(etag) == 64 else (None, etag or None)
            files.append(RemoteFile(rel, full.stat().st_size, sha256, oid))
    return RepoListing(repo, rev, commit, tuple(sorted(files, key=lambda f: f.path)))
