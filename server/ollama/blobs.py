"""``HEAD`` and ``POST /api/blobs/sha256:…``: Ollama's uploads, streamed into the store and verified.

``ollama create`` (a Modelfile ``FROM ./model.gguf``) and ollama-python's ``create_blob`` hash the
file on the client, ask ``HEAD`` whether the server has those bytes, ``POST`` them when it does
not, and name them by digest in ``/api/create``'s ``files``. The upload is streamed to
``<data_dir>/blobs`` (never held in memory: the request guard passes this route's body through),
bounded in size (``server.max_upload_bytes`` and the disk's free space) and in pace (no byte for
``server.body_timeout_s`` ends it), and kept only when its bytes hash to its name. The key guards
it like every other route.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import Response

from localrun.modelstore.blobs import DIGEST_PATTERN, BlobStore, parse_digest
from localrun.server.errors import BodyTooLarge
from localrun.server.generation import app_state
from localrun.server.openapi import documented
from localrun.server.security import BodyTimeout

router = APIRouter(prefix="/api")


def blob_store(request: Request) -> BlobStore:
    return BlobStore(app_state(request).manager.store)


@documented(patterns=(("ref", DIGEST_PATTERN),))
@router.head("/blobs/{ref}")
async def blob_exists(request: Request, ref: str) -> Response:
    """200 when the server has these bytes: an upload, or a registered model's file (a file
    imported without a recorded sha256 is hashed, once, to answer)."""
    found = await asyncio.to_thread(blob_store(request).find, parse_digest(ref))
    return Response(status_code=200 if found is not None else 404)


@documented(upload="application/octet-stream", patterns=(("ref", DIGEST_PATTERN),))
@router.post("/blobs/{ref}")
async def blob_upload(request: Request, ref: str) -> Response:
    """Receive a blob: 201 once its bytes are on disk and hash to ``ref``."""
    digest = parse_digest(ref)
    server = app_state(request).settings.server
    blobs = blob_store(request)
    limit = _upload_limit(blobs, server.max_upload_bytes)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise _too_large(int(length), limit)
    await blobs.receive(digest, _paced(request, limit=limit, stall_s=server.body_timeout_s))
    return Response(status_code=201)


def _upload_limit(blobs: BlobStore, configured: int) -> int:
    """The configured cap, or what the disk under the blobs folder has free, whichever is less."""
    where = blobs.root if blobs.root.exists() else blobs.root.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    return min(configured, shutil.disk_usage(where).free)


def _too_large(size: int, limit: int) -> BodyTooLarge:
    return BodyTooLarge(
        f"the blob ({size} bytes) is larger than the {limit} bytes this server takes",
        hint="free disk space or raise server.max_upload_bytes, or copy the file to the server "
        "and `localrun import PATH` it",
    )


async def _paced(request: Request, *, limit: int, stall_s: float) -> AsyncIterator[bytes]:
    """The body's chunks, ended by a stall of ``stall_s`` or by outgrowing ``limit``."""
    stream = request.stream().__aiter__()
    size = 0
    while True:
        try:
            async with asyncio.timeout(stall_s):
                chunk = await stream.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise BodyTimeout(
                f"the upload sent nothing for {stall_s:g} s",
                hint="send the file again (an upload resumes from nothing), or raise server.body_timeout_s",
            ) from None
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        if chunk:
            yield chunk
