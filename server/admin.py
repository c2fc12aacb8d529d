"""Liveness, metrics and the admin routes the TUI drives.

``/health`` says the server is up and what is loaded; ``/metrics`` is Prometheus text;
``/admin/...`` loads, unloads and pins models and streams status changes (SSE). Every one
of them needs the API key when one is set (the guard middleware sees to that), except
``/health``'s liveness answer (``{"status": "ok"}``, nothing else) for keyless probes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import StringConstraints
from starlette.responses import PlainTextResponse, StreamingResponse

from localrun import __version__
from localrun.server import answers
from localrun.server.errors import InvalidRequest
from localrun.server.fields import parse_body
from localrun.server.generation import app_state
from localrun.server.metrics import render_cache
from localrun.server.openapi import SSE, documented
from localrun.server.schemas import KeepAlive, Strict, keep_alive_seconds
from localrun.server.security import AUTHENTICATED_KEY

log = logging.getLogger(__name__)

router = APIRouter()

ModelName = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class LoadBody(Strict):
    model: ModelName
    keep_alive: KeepAlive = None
    pin: bool | None = None


class ModelOnly(Strict):
    model: ModelName


class PinBody(Strict):
    model: ModelName
    pinned: bool = True


EVENT_INTERVAL_S = 0.5


def status(request: Request) -> dict[str, Any]:
    state = app_state(request)
    manager = state.manager
    models = [dict(info) for info in manager.loaded()]
    return {
        "status": "ok",
        "version": __version__,
        "pid": os.getpid(),
        "uptime_s": round(time.monotonic() - state.started_at, 1),
        "models": models,
        "queue_depth": sum(m.get("active", 0) for m in models),
        "in_flight": sum(m.get("in_flight", 0) for m in models),
        "worker_restarts": manager.worker_restarts,
        "http_in_flight": state.metrics.in_flight,
        "upstreams": manager.upstream_status(),
    }


@documented(answer=answers.Health)
@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    """Liveness for anyone (load balancers and container probes carry no key); the detailed
    view — models, PIDs, queues — only with the key when one is set."""
    if request.scope.get(AUTHENTICATED_KEY) is False:
        return {"status": "ok"}
    return status(request)


# HEAD as well, as load balancers and `curl -I` probe (FastAPI, unlike Starlette, adds no HEAD to a GET).
router.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)


@documented(media="text/plain")
@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    state = app_state(request)
    text = state.metrics.render(loaded=state.manager.loaded(), worker_restarts=state.manager.worker_restarts)
    text += render_cache(await asyncio.to_thread(state.manager.cache_stats))
    if state.upstream_metrics is not None:
        text += state.upstream_metrics.render(state.manager.upstream_status())
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


@documented(answer=answers.AdminStatus)
@router.get("/admin/status")
async def admin_status(request: Request) -> dict[str, Any]:
    data = status(request)
    manager = app_state(request).manager
    records = await asyncio.to_thread(manager.store.list)
    data["store"] = [r.name for r in records]
    cache = await asyncio.to_thread(manager.cache_stats)  # the TUI's Server screen shows it (attached)
    for model in data["models"]:
        if model.get("name") in cache:
            model["cache"] = cache[model["name"]]
    return data


@documented(LoadBody, answers.Loaded, strict=True)
@router.post("/admin/load")
async def admin_load(request: Request) -> dict[str, Any]:
    body: LoadBody = await parse_body(request, LoadBody, lenient=False)
    try:
        keep_alive_s = keep_alive_seconds(body.keep_alive)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="keep_alive") from None
    manager = app_state(request).manager
    lm = await asyncio.to_thread(manager.load, body.model, keep_alive_s=keep_alive_s, pin=body.pin)
    return {"loaded": lm.info()}


@documented(ModelOnly, answers.Unloaded, strict=True)
@router.post("/admin/unload")
async def admin_unload(request: Request) -> dict[str, Any]:
    body: ModelOnly = await parse_body(request, ModelOnly, lenient=False)
    manager = app_state(request).manager
    # A loaded model first, by the name it was loaded as: one removed from the store since
    # (`localrun rm` elsewhere) resolves no more, and its worker must still be let go.
    if await asyncio.to_thread(manager.unload, body.model):
        return {"model": body.model, "unloaded": True}
    record = await asyncio.to_thread(manager.resolve, body.model)
    return {"model": record.name, "unloaded": await asyncio.to_thread(manager.unload, record.name)}


@documented(PinBody, answers.Loaded, strict=True)
@router.post("/admin/pin")
async def admin_pin(request: Request) -> dict[str, Any]:
    body: PinBody = await parse_body(request, PinBody, lenient=False)
    manager = app_state(request).manager
    lm = await asyncio.to_thread(manager.load, body.model, pin=body.pinned)
    return {"loaded": lm.info()}


@documented(stream=SSE)
@router.get("/admin/events")
async def admin_events(request: Request) -> StreamingResponse:
    """SSE: a ``status`` event now and whenever the loaded models change (polled, cheap)."""
    return StreamingResponse(
        _status_events(request, EVENT_INTERVAL_S), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _fingerprint(data: dict[str, Any]) -> str:
    """What counts as a change: models, their activity and pins — not idle clocks."""
    keys = ("name", "active", "in_flight", "pinned", "pid", "runtime")
    ups = [[u["name"], u["health"], u["in_flight"]] for u in data.get("upstreams", ())]
    return json.dumps([[m.get(k) for k in keys] for m in data["models"]] + [data["worker_restarts"]] + ups)


async def _status_events(request: Request, interval_s: float) -> AsyncIterator[bytes]:
    last = None
    quiet = 0.0
    while True:
        data = status(request)
        mark = _fingerprint(data)
        if mark != last:
            last = mark
            quiet = 0.0
            yield b"event: status\ndata: " + json.dumps(data).encode() + b"\n\n"
        elif quiet >= 15.0:
            quiet = 0.0
            yield b": keep-alive\n\n"
        await asyncio.sleep(interval_s)
        quiet += interval_s
