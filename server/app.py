"""``create_app(settings, manager)``: the FastAPI application, dependencies passed in.

Nothing here is global: the settings, the ModelManager and the metrics live on
``app.state``, so the CLI's server and the TUI's embedded one can each build their own.
The middleware stack, outermost first: RefusalGuard (an answer sent before the body was read
drains it within bounds or closes the connection) → Observe (metrics + access log) → HostGuard (the
DNS-rebinding allowlist, before anything else looks at the request) → CORS (local origins by
default, plus server.cors_origins) → IgnoredFieldsHeader → RequestGuard (API key, JSON-only
bodies from browsers, size and time limits) → routes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import PlainTextResponse, Response

from localrun import __version__
from localrun.errors import LocalrunError
from localrun.server import admin, anthropic, llama_server, ollama, openai, openapi, responses
from localrun.server.anthropic.errors import ANTHROPIC
from localrun.server.anthropic.errors import owns as anthropic_owns
from localrun.server.connections import BOOK_STATE, ConnectionBook, RefusalGuard
from localrun.server.errors import (
    SHAPES_KEY,
    ErrorShapes,
    InvalidRequest,
    MethodNotAllowed,
    RouteNotFound,
    allowed_methods,
    error_response,
    shapes_of,
)
from localrun.server.fields import IgnoredFieldsHeader
from localrun.server.metrics import Metrics, Observe, attach_upstream_metrics
from localrun.server.ollama.errors import OLLAMA
from localrun.server.ollama.errors import owns as ollama_owns
from localrun.server.security import (
    CORS_HEADERS,
    LOCAL_ORIGINS,
    HostGuard,
    RequestGuard,
    allowed_host_names,
    trusted_origins,
)
from localrun.server.web.assets import is_web_asset
from localrun.settings import Settings

if TYPE_CHECKING:
    from localrun.manager import ModelManager

log = logging.getLogger(__name__)


def create_app(settings: Settings, manager: ModelManager) -> FastAPI:
    """Build the server for ``manager``. The caller owns the manager and shuts it down."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.started_at = time.monotonic()
        log.info(
            "server ready: %d routes, API key %s", len(app.routes), "required" if settings.server.api_key else "off"
        )
        yield
        log.info("server stopping")

    app = FastAPI(
        title="localrun", version=__version__, docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.settings = settings
    app.state.manager = manager
    app.state.metrics = Metrics()
    app.state.upstream_metrics = attach_upstream_metrics(manager)
    app.state.started_at = time.monotonic()
    # Which error shape a path gets before a route runs (the guards, a 404): its family's.
    setattr(
        app.state,
        SHAPES_KEY,
        ErrorShapes(families=((anthropic_owns, ANTHROPIC), (ollama_owns, OLLAMA))),
    )
    openapi.install(app, settings)  # /openapi.json (and /docs with server.docs), built from the routes' marks

    # Each wire family is a package exposing ``router``; the order is the order paths are matched in,
    # and OpenAI's bare paths (no /v1) come last so every other family's path wins.
    for router in (
        openai.router,
        ollama.router,
        admin.router,
        llama_server.router,
        responses.router,
        anthropic.router,
        responses.bare_router,
        openai.bare_router,
    ):
        app.include_router(router)

    if settings.server.mirror:  # the store as a hub endpoint, behind the same guards (serve --mirror)
        from localrun.server.mirror.listing import Mirror
        from localrun.server.mirror.routes import install_mirror

        install_mirror(app, Mirror(manager.store))

    if settings.server.web:  # the web app at / (server.web = false: the plain liveness line)
        from localrun.server.web import install_web

        install_web(app)
    else:

        @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
        async def root() -> PlainTextResponse:
            return PlainTextResponse("localrun is running")

    _install_error_handlers(app)
    _install_middleware(app, settings)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    def answer(exc: BaseException, path: str) -> Response:
        return error_response(exc, shapes_of(app).shape_for(path), path=path)

    # Each handler is registered for one exception type; Starlette types them all as taking any.
    async def on_localrun_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, LocalrunError) and exc.http_status >= 500:
            log.warning("%s %s: %s", request.method, request.url.path, exc)
        return answer(exc, request.url.path)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else ()
        first = errors[0] if errors else {}
        loc = ".".join(str(p) for p in first.get("loc", ()))
        return answer(
            InvalidRequest(f"invalid {loc or 'request'}: {first.get('msg', '')}", param=loc or None), request.url.path
        )

    async def on_http_error(request: Request, exc: Exception) -> Response:
        path = request.url.path
        if not isinstance(exc, StarletteHTTPException):
            return answer(exc, path)
        if exc.status_code == 404:
            err: LocalrunError = RouteNotFound(
                f"no route {request.method} {path[:200]}", hint="see /v1 (OpenAI) and /api (Ollama) routes"
            )
        elif exc.status_code == 405:
            allowed = allowed_methods(request.app.router.routes, request.scope)
            err = MethodNotAllowed(f"{request.method} is not allowed on {path[:200]}; use {', '.join(allowed)}")
            response = answer(err, path)
            response.headers["Allow"] = ", ".join(allowed)  # RFC 9110 §15.5.6: a 405 says what is allowed
            return response
        else:
            err = LocalrunError(str(exc.detail))
            err.http_status = exc.status_code
        return answer(err, path)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return answer(exc, request.url.path)

    app.add_exception_handler(LocalrunError, on_localrun_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)


def _install_middleware(app: FastAPI, settings: Settings) -> None:
    server = settings.server
    key = server.api_key.get_secret_value() if server.api_key else None
    # add_middleware puts each new one outside the previous: add innermost first.
    book = ConnectionBook(server.max_unauthenticated_connections, enforced=key is not None)
    setattr(app.state, BOOK_STATE, book)  # serve.py's protocol registers each connection in it
    app.add_middleware(
        RequestGuard,
        api_key=key,
        max_body_bytes=server.max_body_bytes,
        body_timeout_s=server.body_timeout_s,
        trusted_origin=trusted_origins(server.cors_origins, local=server.cors_local_origins),
        open_paths=is_web_asset if server.web else None,  # the page loads without the key; its API calls need it
        book=book,
    )
    app.add_middleware(IgnoredFieldsHeader)  # outside RequestGuard: a refused request has no fields to name
    if server.cors_origins or server.cors_local_origins:
        from starlette.middleware.cors import CORSMiddleware

        # Outside RequestGuard: a preflight carries no key, and a refusal still needs the CORS
        # headers for the page to read it. Other origins get no CORS headers, so browsers block them.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(server.cors_origins),
            allow_origin_regex=LOCAL_ORIGINS if server.cors_local_origins else None,
            allow_methods=["GET", "HEAD", "POST", "DELETE", "OPTIONS"],
            allow_headers=list(CORS_HEADERS),
            allow_credentials=False,
            max_age=600,
        )
    app.add_middleware(HostGuard, allowed=allowed_host_names(server.host, server.allowed_hosts))
    app.add_middleware(Observe, metrics=app.state.metrics)
    # Outermost: whatever answers before a body is read (any guard, CORS), the body is drained
    # within bounds or the connection closed with the answer.
    app.add_middleware(
        RefusalGuard,
        max_bytes=min(server.refused_body_max_bytes, server.max_body_bytes),
        timeout_s=min(server.refused_body_timeout_s, server.body_timeout_s),
    )
