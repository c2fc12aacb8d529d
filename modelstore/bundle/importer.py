"""`localrun bundle import`: a bundle's models into the HF cache and the index, verified.

Order of work, so that a bad bundle leaves nothing half-done and an interrupted import
(Ctrl-C, kill -9, power loss) can simply be run again:

1. The lock is parsed whole. A folder bundle is walked (no hashing): unexpected entries,
   symlinks that point anywhere but their own blob, missing files and wrong sizes are
   refused here. A model name taken by another model stops the import too, and free
   space is checked for the bytes that must be copied: all before a byte is written.
2. Each blob goes to ``<cache>/models--org--repo/blobs/<etag>``: hard-linked from the
   bundle when both are on one filesystem (else reflinked, else copied) under a temporary
   name, checked against the lock, then renamed to its final name. Nothing unverified is
   ever at a final path. A blob already there is reused only if it is proven good (the
   index or this import's journal saw it match, and it is untouched since) or re-hashed.
3. Only when every blob is in place: snapshot links, refs, GGUF/MLX validation by the
   store, and one index transaction per model. Re-running converges to the same state.

Hashing: a folder bundle exported on this machine carries a seal (see
:mod:`.source`); its blobs are not re-hashed unless ``rehash=True``. Everything
else is hashed once, while it is copied or linked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localrun.errors import DownloadFailed, LocalrunError, ModelExists
from localrun.jsonfile import NotAJsonObject, open_regular, read_json_object
from localrun.modelstore.bundle.blobcopy import cleaned, copy_hashed, link_or_copy
from localrun.modelstore.bundle.lock import BundleError, Lock, LockModel
from localrun.modelstore.bundle.source import (
    DirBundle,
    Item,
    Readable,
    TarBundle,
    hash_stream,
    open_bundle,
    stat_key,
)
from localrun.modelstore.describe import as_download
from localrun.modelstore.download import check_disk_space
from localrun.modelstore.hfcache import CacheLayout
from localrun.modelstore.hub import hub_cache_dir
from localrun.modelstore.verify import file_path
from localrun.types import FileEntry, ModelRecord, Source

if TYPE_CHECKING:
    from localrun.modelstore.store import ModelStore

logger = logging.getLogger(__name__)


@dataclass
class ImportResult:
    records: list[ModelRecord] = field(default_factory=list)
    linked: int = 0
    reflinked: int = 0
    copied: int = 0
    reused: int = 0
    bytes_hashed: int = 0


class _Journal:
    """Blobs this import already placed and verified: their :func:`.source.stat_key` + sha256 each.

    Lets a re-run after kill -9 skip re-hashing what the killed run proved; a blob touched
    since no longer matches its key and is hashed again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.entries: dict[str, Any] = read_json_object(path)
        except NotAJsonObject:
            self.entries = {}

    def trusted(self, blob: Path, sha256: str) -> bool:
        want = self.entries.get(str(blob))
        return bool(want) and want == [*stat_key(os.stat(blob)), sha256]

    def add(self, blob: Path, sha256: str) -> None:
        self.entries[str(blob)] = [*stat_key(os.stat(blob)), sha256]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.entries))
        os.replace(tmp, self.path)

    def drop(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class _Importer:
    def __init__(
        self,
        store: ModelStore,
        bundle: DirBundle | TarBundle,
        *,
        rehash: bool,
        replace: bool,
        progress: Callable[[str, int, str], None] | None,
    ) -> None:
        self.store, self.bundle, self.lock = store, bundle, bundle.lock
        self.folder = bundle if isinstance(bundle, DirBundle) else None  # a folder's blobs can be linked
        self.rehash, self.replace, self.progress = rehash, replace, progress
        self.cache = hub_cache_dir()
        self.cache.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(bundle.lock_bytes).hexdigest()[:32]
        self.journal = _Journal(store.settings.data_dir / "bundle-imports" / f"{digest}.json")
        self.known = self._index_hashes()
        self.created: list[Path] = []
        self.linked: list[Path] = []
        self.result = ImportResult()
        self.early: dict[str, Future[ModelRecord]] = {}

    def _index_hashes(self) -> dict[str, FileEntry]:
        out = {}
        for rec in self.store.list():
            for e in rec.files:
                if e.sha256:
                    with contextlib.suppress(OSError):
                        out[os.path.realpath(file_path(rec, e.path))] = e
        return out

    # --- phase 1 ------------------------------------------------------------------------

    def check_names(self) -> None:
        for m in self.lock.models:
            existing = self.store.index.find(m.name)
            if existing is not None and existing.repo != m.repo and not self.replace:
                raise ModelExists(
                    f"bundle model {m.name!r}: the name is taken by {existing.repo or existing.path}",
                    hint=f"remove it first (localrun rm {m.name}), or import with --replace",
                )

    def check_space(self) -> None:
        need = 0
        for rel, (m, f) in self.lock.blobs().items():
            blob = self._blob(m, f.etag)
            if blob.exists():
                continue
            if (
                isinstance(self.bundle, DirBundle)
                and os.stat(self.bundle.location / rel).st_dev == os.stat(blob.parent).st_dev
            ):
                continue  # a hard link needs no space
            need += f.size
        check_disk_space(self.cache, need, f"the bundle's {len(self.lock.models)} model(s)")

    def _blob(self, m: LockModel, etag: str) -> Path:
        blob = CacheLayout(self.cache, m.repo).blob(etag)
        blob.parent.mkdir(parents=True, exist_ok=True)
        return blob

    # --- phase 2 ------------------------------------------------------------------------

    def _good_already(self, blob: Path, item: Item, source: Path | None) -> bool:
        """A blob already at its final name: reused only when proven to hold the lock's bytes."""
        if not blob.exists():
            return False
        st = os.stat(blob)
        known = self.known.get(os.path.realpath(blob))
        if not self.rehash and st.st_size == item.size:
            same = known is not None and (known.sha256 or "").lower() == item.sha256 and known.unchanged_at(st)
            if same or self.journal.trusted(blob, item.sha256):
                return True
            sealed = source is not None and self.folder is not None and self.folder.sealed(item, source)
            if sealed and source is not None and os.path.samefile(source, blob):
                return True
        with open(blob, "rb") as f:
            problem = hash_stream(f, item)
        self.result.bytes_hashed += item.size
        if problem is None:
            self.journal.add(blob, item.sha256)
            return True
        logger.warning("%s in the cache does not match the bundle (%s); replacing it", blob, problem)
        blob.unlink()
        return False

    @contextlib.contextmanager
    def _slot(self, m: LockModel, item: Item, source: Path | None) -> Iterator[tuple[Path | None, Path]]:
        """Hold the blob's lock; yield (its temporary name, the blob), the name None when a
        good blob is already in place. The lock is huggingface_hub's and pull's too."""
        from filelock import FileLock

        assert item.file is not None  # only a model's files are placed (wheels are not)
        blob = self._blob(m, item.file.etag)
        lock = CacheLayout(self.cache, m.repo).lock(item.file.etag)
        lock.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock)):
            if self._good_already(blob, item, source):
                self._done(item, "reused")
                yield None, blob
                return
            tmp = blob.with_name(blob.name + ".bundle-partial")
            with cleaned(tmp):
                yield tmp, blob

    def place_from_path(self, item: Item, m: LockModel, folder: DirBundle) -> None:
        source = folder.path_of(item)
        with self._slot(m, item, source) as (tmp, blob):
            if tmp is None:
                return
            trusted = not self.rehash and folder.sealed(item, source)
            how, problem = link_or_copy(source, tmp, trusted), None
            if not trusted and how:
                with open(tmp, "rb") as f:
                    problem = hash_stream(f, item)  # the linked inode or the reflinked copy, read once
            elif not how:
                how, problem = "copied", copy_hashed(source, tmp, item)
            self.result.bytes_hashed += 0 if trusted else item.size
            self._commit(tmp, blob, item, problem)
        self._done(item, how)

    def place_from_stream(self, item: Item, m: LockModel, stream: Readable) -> None:
        with self._slot(m, item, None) as (tmp, blob):
            if tmp is None:
                return
            with open(tmp, "wb") as dst:
                problem = hash_stream(stream, item, dst)
                dst.flush()
                os.fsync(dst.fileno())
            self.result.bytes_hashed += item.size
            self._commit(tmp, blob, item, problem)
        self._done(item, "copied")

    def _commit(self, tmp: Path, blob: Path, item: Item, problem: str | None) -> None:
        if problem:
            raise self.bundle.error(
                item.relpath,
                f"does not match the lock: {problem}",
                hint="the bundle was altered or damaged after export; export or copy it again",
            )
        os.replace(tmp, blob)
        self.created.append(blob)
        self.journal.add(blob, item.sha256)

    def _done(self, item: Item, how: str) -> None:
        setattr(self.result, how, getattr(self.result, how) + 1)
        if self.progress:
            self.progress(item.relpath, item.size, how)

    def validate_early(self, pool: ThreadPoolExecutor) -> None:
        """Walk each model's header in the bundle folder while the blobs are placed.

        The walk is Python (it holds the GIL) and copying is the kernel's (it does not), so
        the two overlap. The bytes walked are the ones placed: both are checked against the
        lock, and a failure there stops the import before anything is registered."""
        if self.folder is None:
            return
        for m in self.lock.models:
            where = self.folder.location / m.snapshot_dir_relpath()
            where = where / m.primary if m.primary else where
            if os.path.lexists(where):  # links absent (a copy on FAT): validated after placing
                self.early[m.name] = pool.submit(self.store.inspect_path, where, name=m.name, fmt=m.format)

    # --- phase 3 ------------------------------------------------------------------------

    def register(self) -> None:
        records = [self._record(m) for m in self.lock.models]
        for rec in records:  # ours from an earlier or concurrent run is replaced, a stranger's only on --replace
            self.result.records.append(self.store.register(rec, replace=self.replace))

    def _record(self, m: LockModel) -> ModelRecord:
        layout = CacheLayout(self.cache, m.repo)
        files = []
        for f in m.files:
            blob = layout.blob(f.etag)
            new = not os.path.lexists(layout.snapshot(m.commit, f.path))
            snap = layout.link(m.commit, f.path, blob)
            if new:
                self.linked.append(snap)
            files.append(FileEntry(str(snap), f.size, f.sha256).matched_at(blob))
        layout.write_ref(m.revision, m.commit)
        primary = layout.snapshot(m.commit, m.primary) if m.primary else layout.snapshot_dir(m.commit)
        early = self.early.get(m.name)  # validates the header / folder
        described = early.result() if early else self.store.inspect_path(primary, name=m.name, fmt=m.format)
        hub = {"endpoint": None if m.synthetic else m.origin, "revision": m.revision, "commit": m.commit}
        record = as_download(
            described,
            path=primary,
            files=files,
            source=Source.BUNDLE,
            repo=m.repo,
            revision=m.commit,
            quant=m.quant,
            hub=hub,
        )
        meta = dict(record.metadata, architecture=record.metadata.get("architecture") or m.architecture)
        files, meta = self._projector(m, layout, primary, files, meta)
        meta["bundle"] = {
            "repo_synthetic": m.synthetic,
            "source": m.source,
            "origin": m.origin,
            "created": self.lock.created,
            "localrun": self.lock.localrun,
        }
        return dataclasses.replace(record, files=tuple(files), metadata=meta)

    def _projector(
        self, m: LockModel, layout: CacheLayout, primary: Path, files: list[FileEntry], meta: dict[str, Any]
    ) -> tuple[list[FileEntry], dict[str, Any]]:
        """The pair again, at its new place: the projector's header is checked like the model's
        (and its width against the model's), then recorded under its path in this cache."""
        if not m.projector:
            return files, meta
        from localrun.modelstore.projector import pair

        snap = layout.snapshot(m.commit, m.projector)
        sha256 = next(e.sha256 for e in files if e.path == str(snap))
        own = tuple(e for e in files if e.path != str(snap))
        probe = ModelRecord(name=m.name, format=m.format, path=str(primary), files=own, metadata=meta)
        paired = pair(probe, snap, owned=True, sha256=sha256)
        return list(paired.files), paired.metadata

    def rollback(self) -> None:
        """A bad bundle: the blobs and links this run created go again; nothing was registered."""
        for blob in self.linked + self.created:
            with contextlib.suppress(FileNotFoundError):
                blob.unlink()
        self.journal.drop()


def import_bundle(
    store: ModelStore,
    path: str | Path,
    *,
    rehash: bool = False,
    replace: bool = False,
    progress: Callable[[str, int, str], None] | None = None,
) -> ImportResult:
    """Make every model of the bundle at ``path`` usable under its name.

    Raises BundleError (names the file and the problem), ModelExists, DownloadFailed (no
    space), InvalidModelFile; in every case no model of the bundle is half-registered.
    """
    bundle = open_bundle(path)
    try:
        imp = _Importer(store, bundle, rehash=rehash, replace=replace, progress=progress)
        if isinstance(bundle, DirBundle):
            bundle.check()  # a damaged bundle is the first thing to hear about
        imp.check_names()
        imp.check_space()
        with ThreadPoolExecutor(1, thread_name_prefix="localrun-bundle-validate") as pool:
            try:
                imp.validate_early(pool)
                _place_all(imp, bundle)
                imp.register()
            except LocalrunError:
                imp.rollback()
                raise
            except OSError as exc:  # the disk, not the bundle: what was verified stays for the next run
                raise _disk_error(exc, imp.cache) from exc
        imp.journal.drop()
        return imp.result
    finally:
        bundle.close()


def _disk_error(exc: OSError, cache: Path) -> LocalrunError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DownloadFailed(
            f"disk full while importing into {cache}", hint="free some space and run the import again: it carries on"
        )
    return DownloadFailed(
        f"cannot write into {cache}: {exc}",
        hint="check the folder's permissions (HF_HUB_CACHE / HF_HOME), then run the import again",
    )


def _place_all(imp: _Importer, bundle: DirBundle | TarBundle) -> None:
    owners = bundle.lock.blobs()
    if isinstance(bundle, DirBundle):
        for item in bundle.expected.values():
            if item.file is not None:
                imp.place_from_path(item, owners[item.relpath][0], bundle)
        return
    for item, stream in bundle.items():
        if item.file is not None:
            imp.place_from_stream(item, owners[item.relpath][0], stream)


def verify_bundle(path: str | Path, *, progress: Callable[[str, int], None] | None = None) -> Lock:
    """Check every entry, size and sha256 of a bundle (models and wheels) without importing."""
    bundle = open_bundle(path)
    try:
        if isinstance(bundle, DirBundle):
            bundle.check()
            for item in bundle.expected.values():
                with open_regular(bundle.path_of(item), follow_symlinks=False) as src:
                    _verified(bundle, item, hash_stream(src, item), progress)
        else:
            for item, stream in bundle.items():
                _verified(bundle, item, hash_stream(stream, item), progress)
        return bundle.lock
    finally:
        bundle.close()


def _verified(
    bundle: DirBundle | TarBundle, item: Item, problem: str | None, progress: Callable[[str, int], None] | None
) -> None:
    if problem:
        raise bundle.error(
            item.relpath,
            f"does not match the lock: {problem}",
            hint="the bundle was altered or damaged after export; export or copy it again",
        )
    if progress:
        progress(item.relpath, item.size)


__all__ = ["ImportResult", "import_bundle", "verify_bundle", "BundleError"]
