"""How a bundle's blob gets into the HF cache: a hard link, else a reflink, else a copy.

A link or a reflink costs no space and no time; only bytes that must be hashed anyway are
copied, and then in the same pass that hashes them (:func:`copy_hashed`). Whatever is made
is made under a temporary name (:func:`cleaned`) that the importer renames once verified.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from localrun.jsonfile import open_regular
from localrun.modelstore.bundle.source import Item, hash_stream

_FICLONE = 0x40049409  # Linux ioctl: share the source's extents (btrfs, xfs, bcachefs)


@contextlib.contextmanager
def cleaned(tmp: Path) -> Iterator[None]:
    """A temporary name that never outlives a failure (a kill -9 leaves it to the next run)."""
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def link_or_copy(source: Path, tmp: Path, trusted: bool) -> str:
    """Hard link, else reflink, else (trusted bytes only) a kernel copy. Returns how, or ""
    when nothing was made: bytes that must be hashed are copied by the caller, in one pass."""
    try:
        os.link(source, tmp)
        return "linked"
    except OSError:
        pass
    try:
        import fcntl

        with open_regular(source) as src, open(tmp, "wb") as dst:
            fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
        return "reflinked"
    except (OSError, ImportError):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if not trusted:
        return ""
    shutil.copyfile(source, tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    return "copied"


def copy_hashed(source: Path, tmp: Path, item: Item) -> str | None:
    with open_regular(source) as src, open(tmp, "wb") as dst:  # a FIFO put in its place is refused
        problem = hash_stream(src, item, dst)
        dst.flush()
        os.fsync(dst.fileno())
    return problem
