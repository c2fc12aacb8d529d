"""The framed pipe protocol between the parent and a worker.

Each frame is a 4-byte big-endian length and a UTF-8 JSON object. JSON keeps it
debuggable; per token it costs a few microseconds, far below a token's time.

Parent → worker ops: ``load`` {runtime, record, plan}; ``chat``/``complete`` {id, req};
``embed`` {id, texts}; ``call`` {id, method, args}; ``cancel`` {id}; ``shutdown``. The request
ops are written and read by :mod:`.ops` (``to_frame`` / ``from_frame``), nowhere else.
Worker → parent events: ``ready`` {info}; ``load_error`` {error}; ``chunk`` {id, c};
``result`` {id, data}; ``end`` {id}; ``error`` {id, error}.

Several requests may be open at once, keyed by id, so a batching scheduler inside the
worker needs no protocol change.
"""

from __future__ import annotations

import json
import struct
import threading
from typing import Any, BinaryIO

_HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024


class FrameWriter:
    """Writes frames to a binary stream; safe to share between threads."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, obj: dict[str, Any]) -> None:
        data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        with self._lock:
            self._stream.write(_HEADER.pack(len(data)) + data)
            self._stream.flush()


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    """Read one frame; ``None`` at a clean or broken end of stream."""
    header = _read_exact(stream, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes exceeds the {MAX_FRAME}-byte limit")
    body = _read_exact(stream, size)
    if body is None:
        return None
    return json.loads(body)


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        part = stream.read(n - len(buf))
        if not part:
            return None
        buf += part
    return bytes(buf)
