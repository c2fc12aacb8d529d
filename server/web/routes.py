"""The web app's routes: the page, its files, and the one JSON view the page needs that no API has.

``GET /admin/models`` is the store as the page's Models view shows it: each model's size, format,
capabilities and whether it fits (the planner's verdict, as ``localrun ls`` and the TUI's Library
show), plus the hub the pulls come from and whether this server is also a hub mirror. The rest of the
page uses the existing routes: ``/v1/models`` (the picker), ``/v1/chat/completions`` (the chat),
``/admin/status`` (what is loaded, upstreams), ``/admin/load`` and ``/admin/unload``, ``/api/pull``
(NDJSON progress) and ``/api/delete``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from localrun.errors import LocalrunError
from localrun.server.answers import Answer
from localrun.server.errors import RouteNotFound
from localrun.server.generation import app_state
from localrun.server.openapi import documented
from localrun.server.web.assets import SECURITY_HEADERS, WEB_PREFIX, Asset, load_assets

if TYPE_CHECKING:
    from localrun.manager import ModelManager
    from localrun.settings import Settings
    from localrun.types import ModelRecord

log = logging.getLogger(__name__)


class WebModels(Answer):
    """The store's models with their fit, the hub and the mirror (``GET /admin/models``)."""

    models: list[dict[str, Any]]
    hub: dict[str, Any]
    mirror: dict[str, Any]


def _answer(asset: Asset, request: Request) -> Response:
    headers = {**SECURITY_HEADERS, "ETag": asset.etag}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    body = b"" if request.method == "HEAD" else asset.body
    response = Response(body, media_type=asset.content_type, headers=headers)
    if request.method == "HEAD":
        response.headers["content-length"] = str(len(asset.body))
    return response


def model_row(record: ModelRecord, manager: ModelManager, settings: Settings) -> dict[str, Any]:
    """One model as the page lists it; the fit is the planner's verdict at its default context."""
    from localrun.modelstore.capabilities import capabilities

    meta = record.metadata or {}
    row: dict[str, Any] = {
        "name": record.name,
        "format": record.format.value,
        "architecture": meta.get("architecture"),
        "quant": meta.get("quant"),
        "size": record.size,
        "context_length": meta.get("context_length"),
        "capabilities": list(capabilities(record, settings)),
        "source": record.source.value,
        "loaded": manager.is_loaded(record.name),
    }
    try:
        plan = manager.plan_for(record)
    except LocalrunError as exc:  # no runtime takes it: the page says why instead of a fit
        row.update(fit=None, fit_reason=str(exc))
        return row
    row.update(
        fit=plan.verdict,
        runtime=plan.runtime,
        device=plan.device,
        planned_ctx=plan.n_ctx,
        planned_slots=plan.options.get("n_slots", 1),
        planned_memory=plan.memory.total if plan.memory else None,
        fit_reason="; ".join(plan.reasons[:2]),
    )
    return row


def _library(manager: ModelManager, settings: Settings) -> dict[str, Any]:
    from localrun.modelstore.hub import hub_endpoint

    rows = [model_row(r, manager, settings) for r in manager.store.list()]
    return {
        "models": rows,
        "hub": {"endpoint": hub_endpoint(settings), "offline": settings.hub.offline},
        "mirror": {
            "enabled": settings.server.mirror,
            "hub_models": sum(1 for r in rows if r["source"] == "hub"),
        },
    }


router = APIRouter()


@documented(answer=WebModels, summary="The store's models with their fit, the hub and the mirror (the web page)")
@router.get("/admin/models")
async def admin_models(request: Request) -> dict[str, Any]:
    state = app_state(request)
    return await asyncio.to_thread(_library, state.manager, state.settings)


def install_web(app: FastAPI) -> None:
    """Add the page (``/``), its files (``/web/NAME``) and ``/admin/models`` to ``app``."""
    assets = load_assets()
    app.include_router(router)

    async def page(request: Request) -> Response:
        asset = assets.get("index.html")
        if asset is None:
            raise RouteNotFound("the web app is not in this install", hint="reinstall localrun")
        return _answer(asset, request)

    @documented(media="text/plain", summary="A file of the web app at / (HTML, CSS, JavaScript)")
    async def web_file(request: Request, name: str) -> Response:
        asset = assets.get(name)
        if asset is None or name == "index.html":
            raise RouteNotFound(f"no file {WEB_PREFIX}{name[:100]}", hint="the web app is at /")
        return _answer(asset, request)

    app.add_api_route("/", page, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_api_route(WEB_PREFIX + "{name}", web_file, methods=["GET", "HEAD"])
