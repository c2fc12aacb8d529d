"""One framing for localrun's pipes: a JSON header, then binary payloads carried raw.

The worker pipe (``localrun.worker``) and the media decoder's child
(``runtimes/llamacpp/media``) both speak it. A frame is::

    word     4 bytes, big-endian: the header's length; its top bit set when payloads follow
    header   that many bytes of UTF-8 JSON (an object)
    -- only when the top bit is set --
    count    4 bytes, big-endian: how many payloads
    sizes    8 bytes, big-endian, per payload
    payloads their bytes, back to back, as they are

A frame without payloads — every chunk of a stream, every cancel — is the word and the JSON,
byte for byte what the worker pipe carried before payloads existed, so a token costs what it
cost. Bytes (an image, an audio clip, decoded pixels) are never base64'd into the JSON: they
cross the pipe once, as themselves, and arrive as one ``bytes`` each.

Bounds: a reader allocates what a frame's lengths say, so every length is checked before a
byte of it is read, and a corrupt or hostile one is a ``ValueError``, never a multi-GiB
allocation. The header is bounded by :data:`MAX_HEADER_BYTES` (64 MiB: a request's text, tools
and whole conversation; the server's body cap, ``server.max_body_bytes``, is 48 MiB); the
payloads by their sum, :data:`MAX_PAYLOAD_BYTES` by default (64 MiB: a request's media, which
``server.max_media_total_bytes`` may raise to exactly this), or what a reader passes for its own
pipe (the decoder's answer is a decoded image: width × height × 3). A writer checks the same
bounds, so an oversized request fails as its own error instead of killing the reader's process.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Sequence
from typing import IO, Any, Protocol

__all__ = ["MAX_HEADER_BYTES", "MAX_PAYLOAD_BYTES", "Frame", "FrameWriter", "read_frame"]

_WORD = struct.Struct(">I")
_COUNT = struct.Struct(">I")
_SIZE = struct.Struct(">Q")
_HAS_PAYLOADS = 1 << 31
#: Largest JSON header a frame may have.
MAX_HEADER_BYTES = 64 * 1024 * 1024
#: Largest sum of one frame's payloads on a pipe that does not set its own bound.
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
#: Most payloads in one frame (a request's media items: ``server.max_media_per_request`` ≤ 1000).
MAX_PAYLOADS = 4096

#: A frame read back: its header and its payloads (``()`` for most frames).
Frame = tuple[dict[str, Any], tuple[bytes, ...]]


class Readable(Protocol):
    def read(self, n: int, /) -> bytes | None: ...


class FrameWriter:
    """Writes frames to a binary stream; safe to share between threads.

    ``bytes_written`` counts every byte it has written: what crossed the pipe.
    """

    def __init__(self, stream: IO[bytes], *, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._max_payload = max_payload_bytes
        self.bytes_written = 0

    def send(self, header: dict[str, Any], payloads: Sequence[bytes] = ()) -> None:
        """Write one frame: ``header`` as JSON, then ``payloads`` raw.

        Raises:
            ValueError: the header or the payloads are over their bound (nothing is written).
            OSError: the pipe is broken.
        """
        data = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(data) > MAX_HEADER_BYTES:
            raise ValueError(f"a frame header of {len(data)} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
        if not payloads:
            frame = _WORD.pack(len(data)) + data
            with self._lock:
                self._stream.write(frame)
                self._stream.flush()
                self.bytes_written += len(frame)
            return
        sizes = [len(p) for p in payloads]
        _check_payloads(len(sizes), sum(sizes), self._max_payload)
        head = b"".join((_WORD.pack(len(data) | _HAS_PAYLOADS), data, _COUNT.pack(len(sizes)), *map(_SIZE.pack, sizes)))
        with self._lock:
            self._stream.write(head)
            for payload in payloads:
                self._stream.write(payload)
            self._stream.flush()
            self.bytes_written += len(head) + sum(sizes)


def read_frame(stream: Readable, *, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> Frame | None:
    """Read one frame from ``stream`` (anything with ``read(n)``); ``None`` at a clean or broken end.

    Raises:
        ValueError: a length over its bound, or a header that is not a JSON object.
    """
    word = _read_exact(stream, _WORD.size)
    if word is None:
        return None
    (size,) = _WORD.unpack(word)
    has_payloads, size = bool(size & _HAS_PAYLOADS), size & ~_HAS_PAYLOADS
    if size > MAX_HEADER_BYTES:
        raise ValueError(f"a frame header of {size} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
    body = _read_exact(stream, size)
    if body is None:
        return None
    header = json.loads(body)
    if not isinstance(header, dict):
        raise ValueError(f"a frame header must be a JSON object, not {type(header).__name__}")
    if not has_payloads:
        return header, ()
    return _read_payloads(stream, header, max_payload_bytes)


def _read_payloads(stream: Readable, header: dict[str, Any], bound: int) -> Frame | None:
    count = _read_exact(stream, _COUNT.size)
    if count is None:
        return None
    (n,) = _COUNT.unpack(count)
    if n > MAX_PAYLOADS:  # checked before the sizes are read: n itself sizes that read
        raise ValueError(f"a frame of {n} payloads exceeds the limit of {MAX_PAYLOADS}")
    raw = _read_exact(stream, _SIZE.size * n)
    if raw is None:
        return None
    sizes = [s for (s,) in _SIZE.iter_unpack(raw)]
    _check_payloads(n, sum(sizes), bound)
    payloads = []
    for size in sizes:
        payload = _read_exact(stream, size)
        if payload is None:
            return None
        payloads.append(payload)
    return header, tuple(payloads)


def _check_payloads(count: int, total: int, bound: int) -> None:
    if count > MAX_PAYLOADS:
        raise ValueError(f"a frame of {count} payloads exceeds the limit of {MAX_PAYLOADS}")
    if total > bound:
        raise ValueError(f"a frame's payloads of {total} bytes exceed the {bound}-byte limit")


def _read_exact(stream: Readable, n: int) -> bytes | None:
    """``n`` bytes, or None when the stream ends first. One read, and so no copy, in the usual case."""
    data = stream.read(n)
    if data is not None and len(data) == n:
        return data
    if not data:
        return None
    parts, got = [data], len(data)
    while got < n:
        part = stream.read(n - got)
        if not part:
            return None
        parts.append(part)
        got += len(part)
    return b"".join(parts)
