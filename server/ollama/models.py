"""Ollama-compatible model management: /api/version, /api/tags, /api/show, /api/ps,
/api/delete and /api/pull (NDJSON progress)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localrun import __version__
from localrun.errors import LocalrunError
from localrun.server.errors import InvalidRequest, NotAvailable, stream_error_line
from localrun.server.fields import parse_body
from localrun.server.generation import app_state
from localrun.server.ollama import answers
from localrun.server.ollama.errors import OLLAMA
from localrun.server.ollama.schemas import ModelBody, PullBody
from localrun.server.ollama.show import ollama_show
from localrun.server.ollama.tags import ollama_ps_entry, ollama_tag, ollama_upstream_tag, upstream_listing
from localrun.server.openapi import NDJSON, documented
from localrun.types import ModelRecord

if TYPE_CHECKING:
    from localrun.manager import ModelManager

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api")

#: The Ollama API level these routes follow (clients gate features on it).
OLLAMA_COMPAT_VERSION = "0.12.0"


@documented(answer=answers.OllamaVersion)
@router.api_route("/version", methods=["GET", "HEAD"])
async def version() -> dict[str, str]:
    return {"version": OLLAMA_COMPAT_VERSION, "localrun": __version__}


@documented(answer=answers.OllamaTags)
@router.get("/tags")
async def tags(request: Request) -> dict[str, Any]:
    state = app_state(request)
    records = await asyncio.to_thread(state.manager.store.list)
    remote = [ollama_upstream_tag(u) for u in upstream_listing(state.manager, records)]
    return {"models": [ollama_tag(r, state.settings) for r in records] + remote}


def _name(body: ModelBody) -> str:
    name = body.model_name()
    if not name:
        raise InvalidRequest("missing required field 'model'", param="model")
    return name


@documented(ModelBody, answers.OllamaShow)
@router.post("/show")
async def show(request: Request) -> dict[str, Any]:
    body: ModelBody = await parse_body(request, ModelBody)
    state = app_state(request)
    record = await asyncio.to_thread(state.manager.resolve, _name(body))
    loaded = next((m for m in state.manager.loaded() if m["name"] == record.name), None)
    return ollama_show(record, loaded, verbose=bool(body.verbose), settings=state.settings)


@documented(answer=answers.OllamaTags)
@router.get("/ps")
async def ps(request: Request) -> dict[str, Any]:
    state = app_state(request)
    manager = state.manager
    entries = []
    cache = await asyncio.to_thread(manager.cache_stats)
    for info in manager.loaded():
        if info["name"] in cache:  # localrun's own view: the prompt cache (`localrun ps` shows it)
            info = {**info, "cache": cache[info["name"]]}
        try:
            record = await asyncio.to_thread(manager.resolve, info["name"])
        except LocalrunError:  # removed from the store while loaded: still worth showing
            record = None
        entries.append(ollama_ps_entry(record, info, state.settings))
    return {"models": entries}


@documented(ModelBody)
@router.delete("/delete")
async def delete(request: Request) -> Response:
    body: ModelBody = await parse_body(request, ModelBody)
    manager = app_state(request).manager
    record = await asyncio.to_thread(manager.resolve, _name(body))
    await asyncio.to_thread(manager.unload, record.name)
    await asyncio.to_thread(manager.store.remove, record.name)
    log.info("deleted %s", record.name)
    return Response(status_code=200)


def _pull_function() -> Callable[..., ModelRecord]:
    try:
        from localrun.modelstore.pull import pull
    except ImportError as exc:
        raise NotAvailable(
            f"pulling models is not available in this installation ({exc})",
            hint="pull with `localrun pull NAME` instead",
        ) from None
    return pull


def _progress_line(p: Any) -> dict[str, Any]:
    """A store Progress (file, done, total, phase) as Ollama's pull status line."""
    file = getattr(p, "file", "")
    phase = getattr(p, "phase", "downloading")
    status = {"checking": "verifying sha256 digest", "done": f"pulled {file}"}.get(phase, f"pulling {file}")
    return {
        "status": status,
        "digest": file,
        "total": int(getattr(p, "total", 0) or 0),
        "completed": int(getattr(p, "done", 0) or 0),
    }


@documented(PullBody, answers.OllamaStatus, stream=NDJSON)
@router.post("/pull")
async def pull(request: Request) -> Response:
    body: PullBody = await parse_body(request, PullBody)
    ref = body.model or body.name
    if not ref:
        raise InvalidRequest("missing required field 'model'", param="model")
    if body.insecure:  # Open WebUI always sends it; localrun's hub client verifies TLS and every file regardless
        log.info("pull of %s: ignoring 'insecure': true (TLS and file hashes are always checked)", ref[:200])
    state = app_state(request)
    if await _registered(state.manager, ref):
        log.info("pull of %s: already registered", ref[:200])
        return _already_pulled(body.stream is not False)
    pull_fn = _pull_function()
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def progress(p: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, ("progress", _progress_line(p)))

    def run() -> None:
        try:
            record = pull_fn(state.manager.store, ref, offline=state.settings.hub.offline, progress=progress)
            loop.call_soon_threadsafe(queue.put_nowait, ("done", record.name))
        except LocalrunError as exc:
            loop.call_soon_threadsafe(queue.put_nowait, ("error", exc))
        except Exception as exc:  # noqa: BLE001 - the thread's failure must reach the client
            log.exception("pull of %s failed", ref)
            loop.call_soon_threadsafe(
                queue.put_nowait, ("error", LocalrunError(f"pull failed: {type(exc).__name__}: {exc}"))
            )

    task = asyncio.ensure_future(asyncio.to_thread(run))
    if body.stream is False:
        while True:
            kind, data = await queue.get()
            if kind == "error":
                await task
                raise data
            if kind == "done":
                await task
                return JSONResponse({"status": "success"})
    return StreamingResponse(_pull_lines(queue, task), media_type="application/x-ndjson")


async def _registered(manager: ModelManager, ref: str) -> bool:
    """Whether ``ref`` names a model already in the store with its files in place: Ollama answers
    success for a model it has, so a client's pull box works for any model the list shows."""
    try:
        await asyncio.to_thread(manager.store.resolve, ref)
    except LocalrunError:  # unknown, an invalid name for the store (a hub URL…), or its files changed: pull it
        return False
    return True


def _already_pulled(stream: bool) -> Response:
    if not stream:
        return JSONResponse({"status": "success"})
    lines = b'{"status":"pulling manifest"}\n{"status":"writing manifest"}\n{"status":"success"}\n'
    return Response(lines, media_type="application/x-ndjson")


async def _pull_lines(queue: asyncio.Queue[tuple[str, Any]], task: asyncio.Future[None]) -> AsyncIterator[bytes]:
    yield b'{"status":"pulling manifest"}\n'
    while True:
        kind, data = await queue.get()
        if kind == "progress":
            yield json.dumps(data).encode() + b"\n"
        elif kind == "error":
            yield json.dumps(stream_error_line(data, OLLAMA)).encode() + b"\n"
            break
        else:
            yield b'{"status":"writing manifest"}\n{"status":"success"}\n'
            break
    await task
