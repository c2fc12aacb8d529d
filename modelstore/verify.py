"""`localrun verify`: re-hash a model's files against the sha256 recorded when it was pulled.

A file can change after it was verified: a disk error, another tool rewriting the cache, a
person editing it. Runtimes load what is on disk, so the check that matters is the one
made now. Every file is hashed (no early stop) so the error names all the bad ones.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localrun.errors import VerificationFailed
from localrun.types import ModelRecord

logger = logging.getLogger(__name__)

_BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class VerifyReport:
    name: str
    checked: tuple[str, ...]  # files whose sha256 matched
    unverifiable: tuple[str, ...]  # files with no recorded sha256 (found in place, never pulled)
    bytes_hashed: int


def file_path(record: ModelRecord, entry_path: str) -> Path:
    """FileEntry paths are absolute; a relative one is taken relative to the model's folder."""
    p = Path(entry_path)
    if p.is_absolute():
        return p
    base = Path(record.path)
    return (base if base.is_dir() else base.parent) / p


def sha256_of(path: str | os.PathLike[str], progress: Callable[[int], None] | None = None) -> str:
    h, done = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            done += len(block)
            if progress:
                progress(done)
    return h.hexdigest()


def verify(record: ModelRecord, *, progress: Callable[[str, int, int], None] | None = None) -> VerifyReport:
    """Hash every file of ``record``; raise VerificationFailed naming each mismatch or missing file."""
    problems: list[str] = []
    checked: list[str] = []
    unverifiable: list[str] = []
    hashed = 0
    for entry in record.files:
        path = file_path(record, entry.path)
        if not path.is_file():
            problems.append(f"{entry.path}: missing")
            continue
        size = path.stat().st_size
        if size != entry.size:
            problems.append(f"{entry.path}: {size} bytes, expected {entry.size}")
            continue
        if not entry.sha256:
            unverifiable.append(entry.path)
            continue
        actual = sha256_of(path, functools.partial(_report, progress, entry.path, entry.size) if progress else None)
        hashed += size
        if actual != entry.sha256:
            problems.append(f"{entry.path}: sha256 {actual}, expected {entry.sha256}")
        else:
            checked.append(entry.path)
    if problems:
        hint = f"pull it again (localrun pull {record.repo})" if record.repo else "restore the file or remove the model"
        raise VerificationFailed(
            f"model {record.name}: {len(problems)} file(s) failed verification: " + "; ".join(problems), hint=hint
        )
    if unverifiable:
        logger.info(
            "%s: %d file(s) have no recorded sha256: %s", record.name, len(unverifiable), ", ".join(unverifiable)
        )
    return VerifyReport(record.name, tuple(checked), tuple(unverifiable), hashed)


def _report(progress: Callable[[str, int, int], None], path: str, size: int, done: int) -> None:
    progress(path, done, size)
