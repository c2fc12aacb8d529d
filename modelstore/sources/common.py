"""What every store source shares: the entry in the registry, and how a found file becomes a record.

A source is another tool's store that localrun reads in place (never copies, never touches):
each module beside this one finds its candidates and returns :class:`ModelRecord`\\ s with
``owned=False``. Another tool's store is input like any other, so a malformed entry is
skipped with a log line, JSON is read bounded and only from regular files, and a projector
is never a model of its own (a file whose header says ``general.architecture == "clip"`` is
skipped whatever it is called).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from localrun.errors import InvalidModelFile
from localrun.jsonfile import NotAJsonObject, read_json_object
from localrun.modelstore.projector import CLIP_ARCH, find_projector_sibling, pair_found
from localrun.types import META_PROJECTOR, FileEntry, Format, ModelRecord, Source

logger = logging.getLogger(__name__)

_MAX_JSON = 1024 * 1024

#: ``locate(name)``: a projector's path on disk and its sha256 (None when the store does not say).
Locate = Callable[[str], tuple[Path, "str | None"]]


class Discover(Protocol):
    """A source's scan: its tool's default location, or ``location``; ``read_metadata=False``
    skips reading headers (a quick listing)."""

    def __call__(
        self, location: str | os.PathLike[str] | None = None, /, *, read_metadata: bool = True
    ) -> list[ModelRecord]: ...


@dataclass(frozen=True)
class StoreSource:
    """One entry of :data:`localrun.modelstore.sources.SOURCES`, under the source's name."""

    source: Source  # what its records say they came from
    discover: Discover  # every candidate in the tool's default location (or ``location``)


def small_json(path: Path) -> dict[str, Any] | None:
    """A small JSON object from another tool's store, or None (not a regular file, too big, not JSON)."""
    try:
        return read_json_object(path, max_bytes=_MAX_JSON, follow_symlinks=False)
    except NotAJsonObject:
        return None


def gguf_facts(path: Path, read_metadata: bool) -> dict[str, Any] | None:
    """GGUF header as a dict; None (and a log line) if the file is not a valid GGUF or is a
    projector under another name (a projector never runs alone)."""
    if not read_metadata:
        return {}
    from localrun.modelstore.gguf_meta import read_gguf_metadata

    try:
        meta = read_gguf_metadata(path).as_dict()
    except InvalidModelFile as exc:
        logger.warning("skipping %s: %s", path, exc)
        return None
    if meta.get("architecture") == CLIP_ARCH:
        logger.info("skipping %s: a multimodal projector, not a model", path)
        return None
    return meta


def with_sibling(
    record: ModelRecord, listing: Iterable[str], primary: str, locate: Locate, read_metadata: bool, where: str
) -> ModelRecord:
    """Pair the projector llama.cpp's rules pick from ``listing`` (names relative to the repo
    folder, ``primary`` among them)."""
    found = find_projector_sibling(listing, primary) if record.format is Format.GGUF else None
    if found is None:
        return record
    path, sha256 = locate(found)
    return attach(record, path, sha256, read_metadata, where)


def attach(record: ModelRecord, path: Path, sha256: str | None, read_metadata: bool, where: str) -> ModelRecord:
    if read_metadata:
        return pair_found(record, path, sha256=sha256, where=where)
    # a quick scan (no headers read): the pair is recorded unchecked, as the model itself is
    meta = dict(record.metadata, **{META_PROJECTOR: str(path)})
    entry = FileEntry(str(path), path.stat().st_size, sha256)
    return dataclasses.replace(record, files=record.files + (entry,), metadata=meta)


def subdirs(path: Path) -> list[Path]:
    """The real folders in ``path`` (symlinks skipped), sorted; none when it cannot be listed."""
    try:
        return sorted(e for e in path.iterdir() if e.is_dir() and not e.is_symlink())
    except OSError:
        return []
