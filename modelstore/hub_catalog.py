"""The mirror's view of the store: repos → commits → files, with the hashes the hub speaks.

Built from the index alone (plus one ``readlink`` per file and the ``refs/`` files of the
HF cache), so a HEAD never reads a model's bytes. Every disk path comes from the index;
nothing a client sends is ever joined onto a folder — a request names a repo, a revision
and a file, and is answered only if that triple is a key here.

The one invariant every client needs (reference A1.4): a file's tree ``oid`` is its git
blob sha1 (for an LFS file, the sha1 of its LFS pointer), ``lfs.oid`` is its sha256, and
the resolve ``ETag`` is ``lfs.oid or oid`` — the name huggingface_hub and llama.cpp both
give the blob in their caches. A file pulled from the hub keeps what the hub said: its
blob in the HF cache is named by that etag. A model with no repo (imported from a path,
Ollama, LM Studio, the built-in one) is served as ``local/<name>``, every file as LFS.

:class:`Verifier` is the "serve only verified bytes" rule: a file is trusted when its
stat (device, inode, size, mtime) is the one at which it last matched its hash; otherwise
it is hashed again before a byte goes out, and refused by name if it no longer matches.
What the verifier learns stays in memory: the mirror never writes the store.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from localrun.errors import LocalrunError, VerificationFailed
from localrun.jsonfile import read_regular
from localrun.modelstore.download import hash_file
from localrun.modelstore.gitids import SYNTHETIC_ORG, is_sha1, is_sha256, lfs_git_oid, synthetic_commit, synthetic_repo
from localrun.modelstore.hfcache import CacheLayout
from localrun.modelstore.hub import FORMAT_TAGS, RemoteFile
from localrun.modelstore.names import safe_relpath
from localrun.modelstore.verify import file_path
from localrun.types import FileEntry, ModelRecord

if TYPE_CHECKING:
    from localrun.modelstore.store import ModelStore

logger = logging.getLogger(__name__)

#: A file's identity on disk (device, inode, size, mtime, ctime): unchanged means unchanged bytes.
StatKey = tuple[int, int, int, int, int]

_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def valid_repo_part(part: str) -> bool:
    """One half of ``ns/name`` as the hub allows it: no separators, no ``..`` or ``--``."""
    return bool(_REPO_PART.match(part)) and ".." not in part and "--" not in part and not part.endswith(".")


@dataclass(frozen=True)
class MirrorFile:
    """One servable file. ``git_oid`` is set only for a plain (non-LFS) git file."""

    path: str
    size: int
    disk: str
    sha256: str | None
    git_oid: str | None
    mtime_ns: int | None  # when the index last saw it match sha256
    ctime_ns: int | None = None  # its change time then: an mtime can be put back, a ctime cannot

    @property
    def lfs(self) -> bool:
        return self.git_oid is None


@dataclass
class MirrorCommit:
    commit: str
    files: dict[str, MirrorFile] = field(default_factory=dict)
    updated: float = 0.0


@dataclass
class MirrorRepo:
    repo: str
    commits: dict[str, MirrorCommit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: set[str] = field(default_factory=set)
    models: list[str] = field(default_factory=list)
    warning: str | None = None  # set when this is a cached copy served because the upstream is down

    def resolve(self, revision: str) -> MirrorCommit | None:
        """A branch name or a full commit this repo holds; nothing else (no invented commits)."""
        commit = self.branches.get(revision) or (revision if is_sha1(revision) else None)
        return self.commits.get(commit) if commit else None

    @property
    def updated(self) -> float:
        return max((c.updated for c in self.commits.values()), default=0.0)


def local_repo_id(name: str) -> str:
    """The repo of a model that has none: ``local/<name>``, the same id a bundle gives it."""
    try:
        return synthetic_repo(name)
    except LocalrunError:
        return f"{SYNTHETIC_ORG}/model"


def _repo_relpath(record: ModelRecord, disk: Path, cache_dir: Path) -> str:
    """The file's path in its repo: below snapshots/<commit>/ in the HF layout, else its name
    (or its path inside an MLX folder)."""
    if record.repo and record.revision:
        try:
            snap = CacheLayout(cache_dir, record.repo).snapshot_dir(record.revision)
            return Path(os.path.abspath(disk)).relative_to(snap).as_posix()
        except (ValueError, LocalrunError):  # not below this repo's snapshot: not in the layout
            pass
    base = Path(record.path)
    if base.is_dir():
        try:
            return Path(os.path.abspath(disk)).relative_to(base).as_posix()
        except ValueError:
            pass
    return disk.name


def _mirror_file(record: ModelRecord, entry: FileEntry, cache_dir: Path) -> MirrorFile | None:
    disk = file_path(record, entry.path)
    try:
        rel = str(safe_relpath(_repo_relpath(record, disk, cache_dir)))
    except Exception:  # noqa: BLE001 - a name the hub could not carry is simply not served
        logger.warning("mirror: %s: %s has no servable repo path; leaving it out", record.name, entry.path)
        return None
    blob = os.path.basename(os.readlink(disk)) if disk.is_symlink() else ""
    sha256 = (entry.sha256 or "").lower() or None
    git_oid = None
    if is_sha1(blob) and record.repo:
        git_oid = blob  # the hub said this is a plain git file with this oid
    elif is_sha256(blob) and sha256 is None:
        sha256 = blob  # the blob's name is the sha256 it was verified against
    return MirrorFile(rel, entry.size, os.path.realpath(disk), sha256, git_oid, entry.mtime_ns, entry.ctime_ns)


def _read_branches(layout: CacheLayout) -> dict[str, str]:
    refs = layout.folder / "refs"
    out: dict[str, str] = {}
    if not refs.is_dir():
        return out
    for path in refs.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                value = read_regular(path, max_bytes=256, follow_symlinks=False).decode().strip()
            except (OSError, UnicodeDecodeError):
                continue
            if is_sha1(value):
                out[path.relative_to(refs).as_posix()] = value
    return out


def build_catalog(records: list[ModelRecord], cache_dir: Path) -> dict[str, MirrorRepo]:
    """Every registered model as hub repos. Records of one repo and commit are merged."""
    repos: dict[str, MirrorRepo] = {}
    for record in records:
        repo_id = record.repo or local_repo_id(record.name)
        ns, _, name = repo_id.partition("/")
        if not (valid_repo_part(ns) and valid_repo_part(name)):
            logger.warning(
                "mirror: %s has repo %r, which the hub protocol cannot carry; leaving it out", record.name, repo_id
            )
            continue
        files = {mf.path: mf for mf in (_mirror_file(record, fe, cache_dir) for fe in record.files) if mf is not None}
        revision = record.revision if record.repo else None
        commit = revision if revision and is_sha1(revision) else _local_commit(record, files)
        repo = repos.setdefault(repo_id, MirrorRepo(repo_id))
        entry = repo.commits.setdefault(commit, MirrorCommit(commit))
        entry.updated = max(entry.updated, record.added_at)
        for path, mf in files.items():
            entry.files.setdefault(path, mf)
        repo.models.append(record.name)
        if tag := FORMAT_TAGS.get(record.format):
            repo.tags.add(tag)
        asked = ((record.metadata or {}).get("hub") or {}).get("revision")
        if isinstance(asked, str) and asked and asked != commit and record.repo:
            repo.branches.setdefault(asked, commit)
    for repo in repos.values():
        if not repo.repo.startswith(SYNTHETIC_ORG + "/"):
            try:
                on_disk = _read_branches(CacheLayout(cache_dir, repo.repo))
            except Exception:  # noqa: BLE001 - unreadable refs: keep what the index said
                on_disk = {}
            repo.branches.update({b: c for b, c in on_disk.items() if c in repo.commits})
        repo.branches = {b: c for b, c in repo.branches.items() if c in repo.commits}
        if not repo.branches:  # the store never saw a branch name: main is its newest commit
            repo.branches["main"] = max(repo.commits.values(), key=lambda c: c.updated).commit
    return repos


class StoreCatalog:
    """One store's catalog, rebuilt only when its index changed (the index file's and its WAL's
    stat, so a HEAD costs two stats, not a read of every record)."""

    def __init__(self, store: ModelStore, cache_dir: Path) -> None:
        self.store = store
        self.cache_dir = cache_dir
        self._repos: dict[str, MirrorRepo] = {}
        self._signature: tuple[tuple[int, int] | None, ...] | None = None

    def _index_signature(self) -> tuple[tuple[int, int] | None, ...]:
        path = self.store.index.path
        out: list[tuple[int, int] | None] = []
        for p in (path, path.with_name(path.name + "-wal")):
            try:
                st = os.stat(p)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def repos(self) -> dict[str, MirrorRepo]:
        sig = self._index_signature()
        if sig != self._signature:
            self._repos = build_catalog(self.store.list(), self.cache_dir)
            self._signature = sig
            logger.debug("mirror: catalog rebuilt, %d repos", len(self._repos))
        return self._repos


def _local_commit(record: ModelRecord, files: dict[str, MirrorFile]) -> str:
    """A stable commit for a model without one: a bundle's when every sha256 is recorded
    (the same commit on both sides of a bundle), else one that changes only with the record."""
    if files and all(f.sha256 for f in files.values()):
        return synthetic_commit(local_repo_id(record.name), [(f.path, f.sha256 or "") for f in files.values()])
    parts = [record.name, record.format.value, repr(record.added_at)] + [f"{f.path}\0{f.size}" for f in record.files]
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()


def _stat_key(st: os.stat_result) -> StatKey:
    """The inode unchanged since it was hashed: ctime too, which (unlike mtime) nothing puts back."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Verifier:
    """Which disk files are known good right now, and their hashes; hashing happens once."""

    def __init__(self) -> None:
        self._good: dict[str, tuple[StatKey, str]] = {}  # disk -> (stat key, sha256)
        # disk -> the first sha256 hashed here for a file the store recorded none for: held to after
        self._first: dict[str, str] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def sha256(self, f: MirrorFile) -> str | None:
        """The file's sha256: recorded, or learned when it was hashed here."""
        known = self._good.get(f.disk)
        return f.sha256 or (known[1] if known else None) or self._first.get(f.disk)

    def good_key(self, f: MirrorFile) -> StatKey | None:
        """The stat key at which ``f`` is known to match, if its current stat is that one."""
        try:
            st = os.stat(f.disk)
        except OSError:
            return None
        key = _stat_key(st)
        known = self._good.get(f.disk)
        if known and known[0] == key:
            return key
        recorded = (f.size, f.mtime_ns, f.ctime_ns)
        if f.sha256 and f.ctime_ns is not None and (st.st_size, st.st_mtime_ns, st.st_ctime_ns) == recorded:
            self._good[f.disk] = (key, f.sha256)  # the index saw it match at exactly this mtime and ctime
            return key
        return None

    def trust(self, f: MirrorFile, sha256: str) -> None:
        """``f`` was just verified by the downloader: its current stat is a good one."""
        try:
            self._good[f.disk] = (_stat_key(os.stat(f.disk)), sha256)
        except OSError:
            self._good.pop(f.disk, None)

    def forget(self, f: MirrorFile) -> None:
        self._good.pop(f.disk, None)

    def verify(self, f: MirrorFile) -> StatKey:
        """Hash ``f`` (blocking) unless it is already known good; return its good stat key.

        Raises VerificationFailed naming the file when it is missing, has the wrong size or
        no longer matches its sha256 / git oid.
        """
        with self._guard:
            lock = self._locks.setdefault(f.disk, threading.Lock())
        with lock:  # concurrent requests for one changed file hash it once
            key = self.good_key(f)
            if key is not None:
                return key
            return self._hash(f)

    def _hash(self, f: MirrorFile) -> StatKey:
        """Hash with the downloader's digest (sha256, and the git sha1 where that is the check).

        The errors name the file by its repo path only: they go to the mirror's clients,
        which have no business with this host's folders; the log gets the disk path.
        """
        where = f.path
        expect = RemoteFile(f.path, f.size, f.sha256, None if f.sha256 else f.git_oid)

        def refused(message: str, hint: str) -> VerificationFailed:
            logger.warning("mirror: %s (%s): %s", f.path, f.disk, message)
            return VerificationFailed(message, hint=hint)

        try:
            before = _stat_key(os.stat(f.disk))
            if before[2] != f.size:
                raise refused(
                    f"{where} is {before[2]} bytes, the store recorded {f.size}",
                    "the file changed on the mirror host; pull or import it again there",
                )
            digest, _ = hash_file(Path(f.disk), expect, None, None)
            after = _stat_key(os.stat(f.disk))
        except FileNotFoundError:
            raise refused(
                f"{where} is missing on the mirror host", "pull or import it again there, or `localrun rm` the model"
            ) from None
        if after != before:
            raise refused(f"{where} changed while it was being checked", "try again in a moment")
        problem = digest.mismatch()
        if problem:
            raise refused(
                f"{where} no longer matches the hash the store recorded ({problem}); the mirror will not serve it",
                "the file was modified on the mirror host; pull or import it again there",
            )
        got = digest.sha256.hexdigest()
        first = self._first.setdefault(f.disk, got) if not f.sha256 else got
        if got != first:  # no recorded hash: the first one hashed here is the file's, and stays so
            raise refused(
                f"{where} changed since the mirror first served it (sha256 {first}, now {got}); "
                "the mirror will not serve it",
                "the file was modified on the mirror host; import it again there (`localrun import --replace`)",
            )
        self._good[f.disk] = (after, got)
        logger.info("mirror: verified %s (%s)", where, f.disk)
        return after


def etag_of(f: MirrorFile, sha256: str | None) -> str | None:
    return f.git_oid if not f.lfs else sha256


def tree_oid(f: MirrorFile, sha256: str | None) -> str | None:
    """The git oid the tree lists: the blob's own, or the LFS pointer's."""
    if not f.lfs:
        return f.git_oid
    return lfs_git_oid(sha256, f.size) if sha256 else None
