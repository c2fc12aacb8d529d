"""One reader for the small JSON objects localrun reads from disk: model configs, manifests,
journals, seals, key files; and the door under it, :func:`open_regular`, for every file localrun
reads that someone else may have put there (KV cache and slot files, a bundle's lock, seal and
refs, the store's side files).

Each of them is input from somewhere else (a downloaded repo, another tool's store, a file
a killed process left half-written), so the reader is bounded (a size cap checked on the
open file, and never more than the cap read), refuses what is not a regular file (a FIFO
would block, a device never ends), and says in one sentence why a file is not a JSON
object. Callers turn that sentence into their own error, or into "nothing there".
"""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Any

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotARegularFile(OSError):
    """A path that is not a regular file, or is larger than its reader's bound; ``why`` says which.

    An :class:`OSError`, so a caller that treats an unreadable file as missing or damaged treats
    this one so too."""

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        super().__init__(f"{path} {why}")
        self.path = os.fspath(path)
        self.why = why


def open_regular(
    path: str | os.PathLike[str], *, max_bytes: int | None = None, follow_symlinks: bool = True
) -> io.BufferedReader:
    """``path`` opened for reading, if it is a regular file (of at most ``max_bytes``).

    Opened with ``O_NONBLOCK``, so a FIFO does not block the open waiting for a writer; then the
    open file's own ``fstat`` decides (no race with a rename). A directory, FIFO, device or socket
    is refused, and so is a file over ``max_bytes``, before a byte is read.

    Raises:
        NotARegularFile: not a regular file, or larger than ``max_bytes``.
        OSError: it cannot be opened (``FileNotFoundError`` when missing).
    """
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
            raise NotARegularFile(path, f"is {kind}, not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise NotARegularFile(path, f"is {st.st_size:,} bytes, more than the {max_bytes:,} it may be")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], *, max_bytes: int, follow_symlinks: bool = True) -> bytes:
    """The whole of ``path``, a regular file of at most ``max_bytes`` (see :func:`open_regular`);
    never more than ``max_bytes`` + 1 bytes are read, even from a file that grows meanwhile."""
    with open_regular(path, max_bytes=max_bytes, follow_symlinks=follow_symlinks) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise NotARegularFile(path, f"grew past the {max_bytes:,} bytes it may be while it was read")
    return data


#: The default cap: far above any config, manifest or journal localrun reads.
MAX_JSON_BYTES = 16 << 20


class NotAJsonObject(ValueError):
    """A file that could not be read as one JSON object; ``str()`` says why, naming the file."""

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = Path(path)
        self.why = why


def read_json_object(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_JSON_BYTES, follow_symlinks: bool = True
) -> dict[str, Any]:
    """The JSON object in ``path``.

    Args:
        path: the file.
        max_bytes: a larger file is refused without being read.
        follow_symlinks: False refuses a symbolic link (another tool's store, where a link
            could lead anywhere).

    Raises:
        NotAJsonObject: missing or unreadable, not a regular file, larger than ``max_bytes``,
            not UTF-8 JSON, or JSON that is not an object.
    """
    try:
        with open_regular(path, follow_symlinks=follow_symlinks) as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise NotAJsonObject(path, f"is {size} bytes, larger than the {max_bytes} bytes a JSON file may be")
            raw = f.read(max_bytes + 1)
    except NotARegularFile:
        raise NotAJsonObject(path, "is not a regular file") from None
    except OSError as exc:
        raise NotAJsonObject(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(raw) > max_bytes:  # it grew while being read
        raise NotAJsonObject(path, f"is larger than the {max_bytes} bytes a JSON file may be")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 is a ValueError too; nesting runs out of stack
        raise NotAJsonObject(path, f"is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise NotAJsonObject(path, f"holds a JSON {type(data).__name__}, not an object")
    return data
