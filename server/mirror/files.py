"""Sending a verified file: Range parsing and the streaming response that guards its bytes.

The file was verified before the headers go out (its stat is then the "good" one); while
the body streams, every block is followed by an ``fstat`` of the open file. If the file
changes on disk mid-way (size or mtime), the response stops there, before its last byte:
the client sees a short body (huggingface_hub and localrun check the length and retry, and
the next HEAD re-hashes the file and refuses it), never a complete-looking wrong file.
Nothing here compresses: ``Content-Encoding`` other than identity breaks every hub client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from localrun.modelstore.hub import RemoteFile
from localrun.modelstore.hub_catalog import StatKey

logger = logging.getLogger(__name__)

BLOCK = 1024 * 1024
# RFC 9110 §14.1: the unit is case-insensitive. At most 19 digits a position: more is past any file,
# and Python refuses to parse 4,300 digits (a ValueError that was a 500 with a traceback).
_RANGE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$", re.IGNORECASE)


class RangeNotSatisfiable(Exception):
    """A Range this file cannot answer (416)."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``bytes=N-``, ``bytes=N-M`` or ``bytes=-K`` → (start, end exclusive); None: the whole file.

    A Range the client should not have sent (multi-range, past the end, malformed) raises
    RangeNotSatisfiable; huggingface_hub sends only the three single forms.
    """
    if header is None:
        return None
    m = _RANGE.match(header.strip().replace(" ", ""))
    if not m or (not m[1] and not m[2]):
        raise RangeNotSatisfiable(
            f"unsupported Range {header[:80]!r} (one range of the form bytes=N-, bytes=N-M or bytes=-K)"
        )
    if not m[1]:  # the last K bytes
        k = int(m[2])
        if k == 0 or size == 0:
            raise RangeNotSatisfiable(f"Range {header[:80]!r} asks for no bytes of a {size}-byte file")
        return max(size - k, 0), size
    start = int(m[1])
    end = min(int(m[2]) + 1, size) if m[2] else size
    if start >= size or (m[2] and int(m[2]) < start):
        raise RangeNotSatisfiable(f"Range {header[:80]!r} starts past the end of the {size}-byte file")
    return start, end


def stat_key(st: os.stat_result) -> StatKey:
    """Must equal :func:`localrun.modelstore.hub_catalog._stat_key`: the good key is compared."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileSlice:
    """An ASGI response streaming ``disk[start:end]`` while the file stays as verified.

    ``on_changed`` is called (and the body cut short) when the file's stat leaves
    ``good_key``; ``refuse`` builds the response sent instead when it has already changed
    before the first byte.
    """

    def __init__(
        self,
        disk: str,
        start: int,
        end: int,
        *,
        status: int,
        headers: dict[str, str],
        good_key: StatKey,
        on_changed: Callable[[], None],
        refuse: Callable[[], Response],
    ) -> None:
        self.disk, self.start, self.end, self.status = disk, start, end, status
        self.headers, self.good_key, self.on_changed, self.refuse = headers, good_key, on_changed, refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            fd = os.open(self.disk, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self.on_changed()
            await self.refuse()(scope, receive, send)
            return
        try:
            if stat_key(os.fstat(fd)) != self.good_key:
                self.on_changed()
                await self.refuse()(scope, receive, send)
                return
            raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
            await send({"type": "http.response.start", "status": self.status, "headers": raw})
            if scope["method"] == "HEAD" or self.end <= self.start:
                await send({"type": "http.response.body", "body": b""})
                return
            await self._stream(fd, receive, send)
        finally:
            os.close(fd)

    async def _stream(self, fd: int, receive: Receive, send: Send) -> None:
        gone = anyio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            pos = self.start
            while pos < self.end and not gone.is_set():
                data = await anyio.to_thread.run_sync(os.pread, fd, min(BLOCK, self.end - pos), pos)
                if not data or stat_key(os.fstat(fd)) != self.good_key:
                    logger.warning(
                        "mirror: %s changed on disk while it was being sent (at byte %d); cutting the response short",
                        self.disk,
                        pos,
                    )
                    self.on_changed()
                    break
                pos += len(data)
                await send({"type": "http.response.body", "body": data, "more_body": pos < self.end})
            tg.cancel_scope.cancel()


class GrowingFile:
    """An ASGI response streaming a file while the pull-through download is still writing it.

    Bytes go out as they land in ``<blob>.incomplete``, except the last block, which is held
    back until the download has been verified; every byte sent is hashed here too, and the
    last block goes out only if everything sent matches the upstream's listing (a download
    that restarted from zero after sending began is caught this way). On any failure the
    body stops short, so a client never holds a complete-looking wrong file.
    """

    def __init__(
        self, partial: str, size: int, *, headers: dict[str, str], done: asyncio.Future[str], expect: RemoteFile
    ) -> None:
        self.partial, self.size, self.headers, self.done, self.expect = partial, size, headers, done, expect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        import asyncio

        from localrun.modelstore.download import FileDigest

        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        hold = min(BLOCK, self.size)
        digest, pos, fd = FileDigest(self.expect), 0, None
        try:
            while pos < self.size:
                finished = self.done.done()
                if finished and (self.done.cancelled() or self.done.exception() is not None):
                    logger.warning("mirror: pull-through of %s failed; cutting the response short", self.partial)
                    return
                if fd is None:
                    try:
                        fd = os.open(
                            self.partial if not finished else self.partial.removesuffix(".incomplete"), os.O_RDONLY
                        )
                    except FileNotFoundError:
                        await asyncio.sleep(0.05)
                        continue
                limit = self.size if finished else self.size - hold
                avail = min(os.fstat(fd).st_size, limit)
                if avail <= pos:
                    if finished:
                        return  # the verified file is shorter than listed: cannot happen after a good fetch
                    await asyncio.sleep(0.05)
                    continue
                data = await anyio.to_thread.run_sync(os.pread, fd, min(BLOCK, avail - pos), pos)
                digest.update(data)
                last = pos + len(data) >= self.size
                if last and digest.mismatch() is not None:
                    logger.warning(
                        "mirror: bytes sent for %s do not match the listing; cutting the response short", self.partial
                    )
                    return
                pos += len(data)
                await send({"type": "http.response.body", "body": data, "more_body": not last})
        finally:
            if fd is not None:
                os.close(fd)
