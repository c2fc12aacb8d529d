"""`localrun bundle export`: registered models -> a verified bundle (a folder or one tar).

The bundle is a Hugging Face cache under ``hub/`` (``models--org--repo/blobs``,
``snapshots/<commit>/…`` relative symlinks, ``refs/<revision>``) plus ``localrun.lock.json``.
Every byte written is hashed as it is written and compared with the sha256 the lock
records, so a file that changed under the store is refused by name instead of carried.
A tar is streamed straight from the store's files (no staging copy); the lock is its
first entry, so an importer knows every size and hash before the first blob arrives.
Either form is written under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from localrun import __version__
from localrun.errors import LocalrunError, VerificationFailed
from localrun.modelstore.bundle.lock import (
    LOCK_NAME,
    WHEELS_DIR,
    BundleError,
    Lock,
    LockFile,
    LockModel,
    LockWheel,
    parse_lock,
)
from localrun.modelstore.bundle.source import SEAL_NAME, Item, hash_stream, stat_key
from localrun.modelstore.gitids import (
    git_blob_hasher,
    is_lfs_path,
    is_sha1,
    is_sha256,
    lfs_git_oid,
    synthetic_commit,
    synthetic_repo,
)
from localrun.modelstore.verify import file_path
from localrun.types import META_PROJECTOR, ModelRecord

if TYPE_CHECKING:
    from localrun.modelstore.store import ModelStore

#: Fills a folder with wheels and returns the lock's ``python`` section.
Wheelhouse = Callable[[Path], dict[str, Any]]
#: Called with each file's bundle path and size as it is written.
Progress = Callable[[str, int], None]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Source:
    """One file to carry: where it is now and what the lock will say about it."""

    local: Path
    entry: LockFile


@dataclass(frozen=True)
class ExportResult:
    path: Path
    lock: Lock
    bytes_written: int


def _hashes(path: Path, lfs: bool) -> tuple[str, str | None]:
    """sha256, and the git blob sha1 for a file git keeps itself (small files)."""
    sha256 = hashlib.sha256()
    sha1 = None if lfs else git_blob_hasher(os.stat(path).st_size)
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            sha256.update(block)
            if sha1 is not None:
                sha1.update(block)
    return sha256.hexdigest(), sha1.hexdigest() if sha1 else None


def _known_sha256(rec: ModelRecord, local: Path) -> str | None:
    """The store's sha256 for a file untouched since it last matched (its own trust rule)."""
    for e in rec.files:
        if file_path(rec, e.path) == local and e.sha256 and e.mtime_ns == os.stat(local).st_mtime_ns:
            return e.sha256.lower()
    return None


def _hub_layout(rec: ModelRecord) -> tuple[str, str, list[tuple[Path, str, str]]] | None:
    """(repo, commit, [(file, repo path, blob name)]) when the record's files sit in an HF snapshot."""
    if not rec.repo:
        return None
    commit, out = None, []
    for e in rec.files:
        p = file_path(rec, e.path)
        parts = p.parts
        if "snapshots" not in parts:
            return None
        k = len(parts) - 1 - parts[::-1].index("snapshots")
        if k + 2 >= len(parts) or not is_sha1(parts[k + 1]) or not parts[k - 1].startswith("models--"):
            return None
        if commit not in (None, parts[k + 1]):
            return None
        commit = parts[k + 1]
        out.append((p, "/".join(parts[k + 2 :]), os.path.basename(os.path.realpath(p))))
    return (rec.repo, commit, out) if commit else None


def _plan_model(rec: ModelRecord, endpoint_default: str) -> tuple[LockModel, list[_Source]]:
    meta = rec.metadata or {}
    raw_hub = meta.get("hub")
    hub_meta: dict[str, Any] = raw_hub if isinstance(raw_hub, dict) else {}
    hub = _hub_layout(rec)
    sources: list[_Source] = []
    if hub:
        repo, commit, files = hub
        endpoint = str(hub_meta.get("endpoint") or endpoint_default)
        synthetic, revision = False, str(hub_meta.get("revision") or commit)
        for local, rel, blob in files:
            lfs = bool(is_sha256(blob)) or (not is_sha1(blob) and is_lfs_path(rel, os.stat(local).st_size))
            sources.append(
                _describe(
                    rec,
                    local,
                    rel,
                    lfs,
                    f"{endpoint}/{repo}/resolve/{commit}/{rel}",
                    git_oid=blob if is_sha1(blob) else None,
                )
            )
        origin = endpoint
    else:
        repo, synthetic, revision = synthetic_repo(rec.name), True, "main"
        base = Path(rec.path)
        for e in rec.files:
            local = file_path(rec, e.path)
            rel = local.relative_to(base).as_posix() if base.is_dir() else _repo_file_name(rec, local)
            sources.append(
                _describe(rec, local, rel, is_lfs_path(rel, os.stat(local).st_size), f"{rec.source.value}:{local.name}")
            )
        commit, origin = synthetic_commit(repo, [(s.entry.path, s.entry.sha256) for s in sources]), rec.source.value
    primary = "" if Path(rec.path).is_dir() else next(s.entry.path for s in sources if s.local == Path(rec.path))
    mmproj = meta.get(META_PROJECTOR)
    projector = next((s.entry.path for s in sources if mmproj and s.local == Path(mmproj)), "")
    model = LockModel(
        name=rec.name,
        format=rec.format,
        repo=repo,
        synthetic=synthetic,
        revision=revision,
        commit=commit,
        primary=primary,
        files=tuple(s.entry for s in sources),
        quant=meta.get("quant") or None,
        architecture=meta.get("architecture") or None,
        source=rec.source.value,
        origin=origin,
        projector=projector,
    )
    return model, sources


def _repo_file_name(rec: ModelRecord, local: Path) -> str:
    """A GGUF keeps its name; one stored under a digest (Ollama's ``sha256-…`` blobs) is
    named after the model, so the synthetic repo reads like a hub repo."""
    if local.name.lower().endswith(".gguf") or len(rec.files) != 1:
        return local.name
    return re.sub(r"[^a-z0-9._-]+", "-", rec.name).strip("-.") + ".gguf"


def _describe(rec: ModelRecord, local: Path, rel: str, lfs: bool, origin: str, git_oid: str | None = None) -> _Source:
    if not local.is_file():
        raise VerificationFailed(
            f"model {rec.name!r}: {local} is missing", hint=f"restore it, or `localrun rm {rec.name}`"
        )
    size = os.stat(local).st_size
    sha256 = _known_sha256(rec, local)
    if sha256 is None or (not lfs and git_oid is None):
        sha256, git_oid = _hashes(local, lfs)
    oid = lfs_git_oid(sha256, size) if lfs else git_oid or ""
    return _Source(local, LockFile(path=rel, size=size, sha256=sha256, git_oid=oid, lfs=lfs, origin=origin))


def plan_export(store: ModelStore, names: list[str]) -> tuple[Lock, dict[str, _Source]]:
    """The lock for ``names`` and, per bundle blob path, the local file that fills it."""
    from localrun.modelstore.hub import hub_endpoint

    models: list[LockModel] = []
    sources: dict[str, _Source] = {}
    seen: set[str] = set()
    for name in names:
        rec = store.resolve(name)  # also proves every file is there, at its registered size
        if rec.name in seen:
            continue
        seen.add(rec.name)
        model, files = _plan_model(rec, hub_endpoint(store.settings))
        if any(m.repo == model.repo and m.synthetic != model.synthetic for m in models):
            raise BundleError(f"two models map to the repo {model.repo}", hint="export them in separate bundles")
        models.append(model)
        for s in files:
            sources.setdefault(model.blob_relpath(s.entry), s)
    lock = Lock(models=tuple(models), created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), localrun=__version__)
    parse_lock(lock.to_json())  # the exporter never writes a lock its own importer would refuse
    return lock, sources


def _refuse_existing(out: Path) -> None:
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise LocalrunError(f"{out} already exists", hint="choose a new path, or remove it first")


def export_bundle(
    store: ModelStore,
    names: list[str],
    out: str | Path,
    *,
    wheelhouse: Wheelhouse | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> ExportResult:
    """Write the bundle for ``names`` to ``out`` (a ``.tar`` path: one tar; else a folder).

    ``wheelhouse`` (optional) fills a folder with wheels and returns the lock's ``python``
    section. Raises ModelNotFound, VerificationFailed (a file changed), LocalrunError.
    """
    out = Path(out).expanduser().absolute()
    _refuse_existing(out)
    lock, sources = plan_export(store, names)
    _remove_dead_partials(out)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        if out.suffix == ".tar":
            written = _write_tar(partial, lock, sources, wheelhouse, progress)
            lock = written[1]
            os.replace(partial, out)
        else:
            partial.mkdir(parents=True)
            lock = _write_dir(partial, lock, sources, wheelhouse, progress)
            with contextlib.suppress(OSError):
                out.rmdir()
            os.rename(partial, out)
    except OSError as exc:  # the destination, not the store: nothing half-written is left
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise LocalrunError(
            f"cannot write the bundle {out}: " + ("disk full" if full else str(exc)),
            hint="free some space or choose another -o path" if full else "check the folder and its permissions",
        ) from exc
    finally:
        if partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
        elif partial.exists():
            partial.unlink()
    logger.info("exported %d model(s) to %s", len(lock.models), out)
    return ExportResult(out, lock, lock.total_bytes + sum(w.size for w in lock.wheels))


def _remove_dead_partials(out: Path) -> None:
    """What an export killed before its rename left beside ``out`` (its process is gone)."""
    import psutil

    for p in out.parent.glob(f".{out.name}.partial-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            logger.info("removing %s, left by an interrupted export", p)
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _item(rel: str, e: LockFile) -> Item:
    return Item(rel, e.size, e.sha256, None if e.lfs else e.git_oid, e)


def _fail(rel: str, s: _Source, problem: str) -> VerificationFailed:
    return VerificationFailed(
        f"{s.local} changed while it was exported ({rel}: {problem}); nothing was written",
        hint="`localrun verify` the model, pull or import it again, then export",
    )


def _write_dir(
    root: Path, lock: Lock, sources: dict[str, _Source], wheelhouse: Wheelhouse | None, progress: Progress | None
) -> Lock:
    seal: dict[str, list[int]] = {}
    if wheelhouse is not None:  # first: the step most likely to refuse (a native wheel, no index)
        lock = _add_wheels(lock, root / WHEELS_DIR, wheelhouse, seal)
    for rel, s in sources.items():
        dest = root.joinpath(*rel.split("/"))
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(s.local, "rb") as src, open(dest, "wb") as dst:
            problem = hash_stream(src, _item(rel, s.entry), dst)
            dst.flush()
            os.fsync(dst.fileno())
        if problem:
            raise _fail(rel, s, problem)
        seal[rel] = stat_key(os.stat(dest))
        if progress:
            progress(rel, s.entry.size)
    for rel, target in lock.links().items():
        link = root.joinpath(*rel.split("/"))
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)
    for rel, commit in lock.refs().items():
        ref = root.joinpath(*rel.split("/"))
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    data = lock.to_json()
    (root / LOCK_NAME).write_bytes(data)
    (root / SEAL_NAME).write_text(json.dumps({"lock_sha256": hashlib.sha256(data).hexdigest(), "files": seal}))
    return lock


def _add_wheels(lock: Lock, folder: Path, wheelhouse: Wheelhouse, seal: dict[str, list[int]] | None) -> Lock:
    import dataclasses

    folder.mkdir(parents=True, exist_ok=True)
    python = wheelhouse(folder)
    wheels = []
    for p in sorted(folder.iterdir()):
        if p.is_file() and not p.is_symlink():
            rel = f"{WHEELS_DIR}/{p.name}"
            sha256, _ = _hashes(p, True)
            wheels.append(LockWheel(rel, p.stat().st_size, sha256))
            if seal is not None:
                seal[rel] = stat_key(p.stat())
    return dataclasses.replace(lock, python=python, wheels=tuple(wheels))


class _HashingReader:
    """Hands tarfile a source file's bytes while hashing them against the lock."""

    def __init__(self, f: BinaryIO, item: Item) -> None:
        self.f, self.item, self.digest, self.done = f, item, item.digest(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.digest.update(data)
        self.done += len(data)
        return data


def _write_tar(
    partial: Path, lock: Lock, sources: dict[str, _Source], wheelhouse: Wheelhouse | None, progress: Progress | None
) -> tuple[int, Lock]:
    import tempfile

    with contextlib.ExitStack() as stack:
        if wheelhouse is not None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="localrun-wheels-")))
            lock = _add_wheels(lock, tmp, wheelhouse, None)
        f = stack.enter_context(open(partial, "wb"))
        tar = stack.enter_context(tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT))
        now = time.time()
        _add_bytes(tar, LOCK_NAME, lock.to_json(), now)
        for rel, s in sources.items():
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode = s.entry.size, now, 0o644
            with open(s.local, "rb") as src:
                reader = _HashingReader(src, _item(rel, s.entry))
                try:
                    tar.addfile(info, reader)
                except OSError as exc:  # tarfile: the file ended before its size
                    raise _fail(rel, s, str(exc)) from None
                problem = reader.item.problem(reader.digest, reader.done) or (None if src.read(1) == b"" else "it grew")
            if problem:
                raise _fail(rel, s, problem)
            if progress:
                progress(rel, s.entry.size)
        for rel, target in lock.links().items():
            info = tarfile.TarInfo(rel)
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, now
            tar.addfile(info)
        for rel, commit in lock.refs().items():
            _add_bytes(tar, rel, commit.encode(), now)
        for w in lock.wheels:
            tar.add(str(tmp / Path(w.path).name), arcname=w.path, recursive=False)
        tar.close()
        f.flush()
        os.fsync(f.fileno())
    return partial.stat().st_size, lock


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), mtime, 0o644
    tar.addfile(info, io.BytesIO(data))
