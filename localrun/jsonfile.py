"""One reader for the small JSON objects localrun reads from disk: model configs, manifests,
journals, seals, key files.

Each of them is input from somewhere else (a downloaded repo, another tool's store, a file
a killed process left half-written), so the reader is bounded (a size cap checked on the
open file, and never more than the cap read), refuses what is not a regular file (a FIFO
would block, a device never ends), and says in one sentence why a file is not a JSON
object. Callers turn that sentence into their own error, or into "nothing there".
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

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
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise NotAJsonObject(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAJsonObject(path, "is not a regular file")
        if st.st_size > max_bytes:
            raise NotAJsonObject(path, f"is {st.st_size} bytes, larger than the {max_bytes} bytes a JSON file may be")
        raw = _read_at_most(fd, max_bytes + 1)
    except OSError as exc:
        raise NotAJsonObject(path, f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:  # it grew while being read
        raise NotAJsonObject(path, f"is larger than the {max_bytes} bytes a JSON file may be")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 is a ValueError too; nesting runs out of stack
        raise NotAJsonObject(path, f"is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise NotAJsonObject(path, f"holds a JSON {type(data).__name__}, not an object")
    return data


def _read_at_most(fd: int, limit: int) -> bytes:
    parts, left = [], limit
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)
