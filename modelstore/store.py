"""The model store: register model files, find them by name, remove them safely.

What it promises:

* Nothing is registered that did not pass validation: a GGUF's header is walked with
  bounds checks (:mod:`.gguf_meta`), every shard of a split GGUF is checked, an MLX folder
  must be config + safetensors with sane headers and no code. A corrupt file raises
  :class:`InvalidModelFile` and the index is untouched.
* Imported files are registered in place, never copied, and never deleted: only records
  with ``owned=True`` (files localrun itself wrote — the built-in model, hub pulls) have
  their files removed, and only when no other record still uses them.
* Hashing is lazy. Importing records each file's size (and mtime in the metadata); the
  sha256 of a multi-GB file would take minutes at import. :meth:`ModelStore.verify` hashes
  on demand: it checks a known sha256, or records one the first time (trust on first
  verify). :meth:`ModelStore.resolve` checks sizes on every use, which is free.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from localrun.errors import InvalidModelFile, ModelExists, ModelNotFound, VerificationFailed
from localrun.settings import Settings
from localrun.types import Format, ModelRecord

from . import builtins
from .describe import describe_path
from .hub import hub_cache_dir
from .index import ModelIndex
from .projector import foreign_projector
from .resolve import DiscoveredModels, lookup_names, not_found, pick_reference
from .verify import file_path, sha256_of

logger = logging.getLogger(__name__)


class ModelStore:
    """Registered models and their files. Pass it settings; it opens the index itself."""

    def __init__(self, settings: Settings, *, index: ModelIndex | None = None) -> None:
        self.settings = settings
        self.index = index if index is not None else ModelIndex(settings.index_path)
        self.discovered = DiscoveredModels()  # what other apps keep on disk, for names `ls --all` shows

    # --- import ------------------------------------------------------------------------

    def import_path(
        self, path: str | Path, *, name: str | None = None, replace: bool = False, mmproj: str | Path | None = None
    ) -> ModelRecord:
        """Validate a GGUF file (first shard of a split one) or an MLX folder and register it
        in place. Importing the same path under the same name again returns the record.
        ``mmproj``: a projector file to pair with the model (see :meth:`pair_projector`).

        Raises:
            ModelNotFound: nothing at ``path``.
            InvalidModelFile: the file or a shard fails validation (nothing is registered).
            InvalidName: ``name`` is not a valid model name.
            ModelExists: the name is taken by another model and ``replace`` is False.
        """
        record = self.inspect_path(path, name=name)
        if mmproj is not None:
            record = self.with_projector(record, mmproj)
        existing = self.index.find(record.name)
        if existing is not None and not replace and existing.path == record.path and existing.files == record.files:
            return existing
        return self.index.add(record, replace=replace)

    def with_projector(self, record: ModelRecord, mmproj: str | Path) -> ModelRecord:
        """``record`` (not yet stored) paired by hand with ``mmproj``: checked, never owned."""
        from .projector import pair

        if record.format is not Format.GGUF:
            raise InvalidModelFile(
                f"{record.name} is a {record.format.value} model; a projector pairs with a GGUF model",
                hint="MLX vision models keep their vision weights in the model folder",
            )
        return pair(record, mmproj, owned=False)

    def pair_projector(self, name: str, mmproj: str | Path) -> ModelRecord:
        """Give a registered GGUF model a projector (replacing any it had): the file is checked
        to be a clip GGUF whose projection width is the model's, registered in place, never
        copied, and never deleted by `rm` (localrun did not write it).

        Raises ModelNotFound, InvalidModelFile."""
        rec = self.index.get(name)
        return self.index.add(self.with_projector(rec, mmproj), replace=True)

    def register(self, record: ModelRecord, *, replace: bool = False) -> ModelRecord:
        """The one door through which pull, bundle import and the built-ins add or replace a record.

        A record from the same repo as the one under its name (a re-pull, a bundle imported
        again or by a concurrent import, a built-in refreshed) replaces it: that is the same
        model coming back. A name held by anything else (another repo, an imported file) is
        kept unless ``replace``. Each write is one index transaction, so two processes
        registering the same record converge on it instead of failing.

        Raises:
            InvalidName: the record's name is not a valid model name.
            ModelExists: the name is held by another model and ``replace`` is False.
        """
        try:
            return self.index.add(record, replace=replace)
        except ModelExists:
            existing = self.index.find(record.name)
            if existing is not None and existing.repo != record.repo:
                hint = f"remove it first (localrun rm {record.name}), or replace it (--replace)"
                holder = existing.repo or existing.path
                raise ModelExists(f"the name {record.name} is taken by {holder}", hint=hint) from None
            return self.index.add(record, replace=True)

    def inspect_path(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        fmt: Format | None = None,
        trust_remote_code: bool = False,
    ) -> ModelRecord:
        """Validate what is at ``path`` and describe it as a record, without registering it
        (see :func:`.describe.describe_path`, the one door pull and bundle import use too)."""
        return describe_path(path, name=name, fmt=fmt, trust_remote_code=trust_remote_code)

    # --- lookup ------------------------------------------------------------------------

    def list(self) -> list[ModelRecord]:
        return self.index.list()

    def resolve(self, name_or_path: str | Path, *, allow_path: bool = False) -> ModelRecord:
        """The model a name means (see :mod:`.resolve`: a registered name or alias, its ``:latest``
        twin, a hub reference to what was pulled, or another app's model that ``ls --all`` lists),
        else (only when ``allow_path``) a path to a model file or folder, validated and returned
        as a transient record that is not stored.

        Paths are off by default because the server and the model manager resolve names
        that arrive over HTTP, and no request may name a file on the server; the CLI, where
        the person typing owns the machine, passes ``allow_path=True``.
        Registered models get a cheap check that their files are still there, same size.

        Raises:
            ModelNotFound: nothing by that name (the message names the nearest), nor (when
                allowed) an existing path; or a reference that names several models.
            VerificationFailed: a registered file changed size since it was registered.
        """
        text = str(name_or_path)
        rec = self.find_registered(text)
        if rec is not None:
            self._check_files_present(rec)
            return rec
        if allow_path and Path(text).expanduser().exists():
            return self.inspect_path(text)
        found = self.discovered.find(text)
        if found is not None:
            return found
        raise not_found(text, self.known_names(), allow_path=allow_path)

    def find_registered(self, text: str) -> ModelRecord | None:
        """The registered model ``text`` names (name, alias, ``:latest`` twin or hub reference), or None."""
        for key in lookup_names(text):
            rec = self.index.find(key)
            if rec is not None:
                return rec
        return pick_reference(text, self.index.list())

    def known_names(self) -> tuple[str, ...]:
        """Every name a person may use: registered, aliases, the built-ins and the other apps' models."""
        names = [r.name for r in self.index.list()] + list(self.index.aliases())
        names += [builtins.DEFAULT_MODEL_NAME, builtins.CHAT_MODEL_NAME]
        names += [r.name for r in self.discovered.records()]
        return tuple(dict.fromkeys(names))

    def _check_files_present(self, rec: ModelRecord) -> None:
        for entry in rec.files:
            try:
                size = os.stat(file_path(rec, entry.path)).st_size
            except FileNotFoundError:
                raise ModelNotFound(
                    f"model {rec.name!r}: file {entry.path} is missing",
                    hint=f"restore it, or `localrun rm {rec.name}` and import it again",
                ) from None
            if size != entry.size:
                raise VerificationFailed(
                    f"model {rec.name!r}: {entry.path} is {size} bytes, {entry.size} when registered",
                    hint=f"the file changed on disk; `localrun import --replace` it or `localrun rm {rec.name}`",
                )
        self._recheck_touched(rec)

    def _recheck_touched(self, rec: ModelRecord) -> None:
        """A file with a known sha256 that was modified since it last matched is re-hashed
        before use, so a flipped byte is refused by name; an untouched file costs one stat."""
        touched = []
        for entry in rec.files:
            if entry.sha256 is None:
                continue
            if not entry.unchanged_at(os.stat(file_path(rec, entry.path))):  # mtime and ctime, not mtime alone
                touched.append(entry)
        if not touched:
            return
        entries = {e.path: e for e in rec.files}
        for entry in touched:
            path = file_path(rec, entry.path)
            digest = sha256_of(path)
            if digest != (entry.sha256 or "").lower():
                raise VerificationFailed(
                    f"model {rec.name!r}: {entry.path} was modified and no longer matches its sha256",
                    hint=f"pull or import it again, or `localrun rm {rec.name}`",
                )
            entries[entry.path] = entry.matched_at(path)
        self.index.add(dataclasses.replace(rec, files=tuple(entries[e.path] for e in rec.files)), replace=True)

    def verify(self, name: str) -> ModelRecord:
        """Re-hash every file of a model. A known sha256 must match; an unknown one is
        recorded now (trust on first verify). Returns the (possibly updated) record."""
        rec = self.index.get(name)
        self._check_files_present(rec)
        entries, learned = [], False
        for entry in rec.files:
            digest = sha256_of(file_path(rec, entry.path))
            if entry.sha256 is not None and digest != entry.sha256.lower():
                raise VerificationFailed(
                    f"model {rec.name!r}: {entry.path} has sha256 {digest}, expected {entry.sha256}",
                    hint="the file is corrupt or was modified; download or import it again",
                )
            learned |= entry.sha256 is None or entry.ctime_ns is None
            entries.append(dataclasses.replace(entry, sha256=digest).matched_at(file_path(rec, entry.path)))
        if learned:
            rec = self.index.add(dataclasses.replace(rec, files=tuple(entries)), replace=True)
        return rec

    # --- removal -----------------------------------------------------------------------

    def remove(self, name: str) -> ModelRecord:
        """Unregister a model. Its files are deleted only if localrun owns them (it wrote
        them), they lie under localrun's data dir or the HF cache, and no other record
        uses them. Imported files are never deleted. ``name`` is any name :meth:`resolve` takes.

        Raises:
            ModelNotFound: no registered model by that name; one that another app keeps (``ls
                --all``) is named as such, since localrun never deletes another app's files.
        """
        found = self.find_registered(name)
        if found is None:
            other = self.discovered.find(name)
            if other is not None:
                raise ModelNotFound(
                    f"{other.name} is not registered with localrun: it is {other.source.value}'s, at {other.path}",
                    hint=f"localrun never deletes another app's files; remove it with {other.source.value}",
                )
            raise not_found(name, self.known_names())
        rec = self.index.remove(found.name)
        if not rec.owned:
            return rec
        in_use = {os.path.realpath(file_path(o, f.path)) for o in self.index.list() for f in o.files}
        roots = [self.settings.data_dir.resolve(), hub_cache_dir().resolve()]
        foreign = foreign_projector(rec)
        for entry in rec.files:
            link = file_path(rec, entry.path)
            if entry.path == foreign:
                logger.info("keeping %s: a projector paired by hand, not written by localrun", link)
                continue
            where = link.parent.resolve() / link.name  # the entry itself, symlink not followed
            real = Path(os.path.realpath(link))
            if str(real) in in_use:
                logger.info("keeping %s: another model uses it", link)
            elif not all(any(p.is_relative_to(root) for root in roots) for p in (where, real)):
                logger.warning("not deleting %s: outside localrun's data dir and the HF cache", link)
            else:
                _unlink_owned(link, real)
                _prune_repo(link)
        return rec

    def drop_unregistered(self, links: Iterable[Path]) -> None:
        """Delete files a refused pull fetched into the HF cache (a snapshot link and its blob),
        so no other tool finds them there, unless a registered model uses them."""
        in_use = {os.path.realpath(file_path(o, f.path)) for o in self.index.list() for f in o.files}
        for link in links:
            real = Path(os.path.realpath(link))
            if str(real) not in in_use:
                _unlink_owned(link, real)
                _prune_repo(link)

    # --- the models that come with localrun ------------------------------------------------

    def ensure_default_model(self) -> ModelRecord | None:
        """Register the embedded Gemma 3 270M; see :func:`.builtins.ensure_default_model`."""
        return builtins.ensure_default_model(self)

    def ensure_chat_model(self) -> ModelRecord | None:
        """Register the default chat model (SmolLM2 135M Instruct) when the set-up fetched it."""
        return builtins.ensure_chat_model(self)


def _unlink_owned(link: Path, real: Path) -> None:
    """Delete an owned file. In the HF cache layout the entry is a snapshot symlink to a
    blob: the blob goes too, unless another snapshot of the repo still links to it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link)
        logger.info("deleted %s", link)
    if real == link or real.parent.name != "blobs" or not real.exists():
        return
    snapshots = real.parent.parent / "snapshots"
    for other in snapshots.rglob("*") if snapshots.is_dir() else ():
        if other.is_symlink() and Path(os.path.realpath(other)) == real:
            logger.info("keeping blob %s: %s still links to it", real, other)
            return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(real)
        logger.info("deleted %s", real)


def _prune_repo(link: Path) -> None:
    """After an owned file went: its snapshot folders left empty go, and the repo's whole HF cache
    folder (``models--org--repo``) when no snapshot file and no blob (nor partial download) is left,
    so `rm` leaves no empty folders behind. Anything else in the folder keeps it."""
    repo = next((p for p in link.parents if p.name.startswith("models--")), None)
    if repo is None:
        return
    snapshots, blobs = repo / "snapshots", repo / "blobs"
    for folder in sorted((p for p in snapshots.rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only an empty one
    if any(snapshots.iterdir() if snapshots.is_dir() else ()) or any(blobs.iterdir() if blobs.is_dir() else ()):
        return
    known = {"snapshots", "blobs", "refs", ".no_exist"}
    if any(entry.name not in known for entry in repo.iterdir()):
        return
    shutil.rmtree(repo, ignore_errors=True)
    logger.info("deleted %s: nothing of the repo is left", repo)
