"""The one place where an error becomes an HTTP response: the server's errors and its mapper.

Every failure the server reports — a LocalrunError from the core, a request that fails
its schema, a Host the allowlist refuses, a stream that fails after it started — goes
through :func:`error_response` (or :func:`stream_error_line`): an unexpected exception
becomes an internal error (logged here), the status is kept to 4xx/5xx, and the
:class:`ErrorShape` of the route's family writes the body. A family whose wire has its own
shape keeps it in its folder (``ollama/errors.py``, ``anthropic/errors.py``,
``mirror/errors.py``) and hands it here; the app's :class:`ErrorShapes` table says which
shape a path gets, for the errors raised before any route runs (the guards, a 404).

The default is OpenAI's object, ``{"error": {"message", "type", "param", "code"}}``: the
OpenAI, Responses, llama-server and admin routes all answer in it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Scope

from localrun.errors import LocalrunError, Overloaded
from localrun.server.answers import OpenAIError

log = logging.getLogger(__name__)


class InvalidRequest(LocalrunError):
    """A request body or parameter that is malformed, out of bounds or unknown."""

    http_status = 400
    code = "invalid_request"


class Unauthorized(LocalrunError):
    """No API key, or the wrong one, on a server that requires one."""

    http_status = 401
    code = "invalid_api_key"


class HostNotAllowed(LocalrunError):
    """A Host header outside the allowlist: the DNS-rebinding guard."""

    http_status = 403
    code = "host_not_allowed"


class RouteNotFound(LocalrunError):
    http_status = 404
    code = "not_found"


class MethodNotAllowed(LocalrunError):
    http_status = 405
    code = "method_not_allowed"


class BodyTooLarge(LocalrunError):
    http_status = 413
    code = "request_too_large"


class NotJson(LocalrunError):
    """A body that is not ``application/json`` (browsers send text/plain without a preflight)."""

    http_status = 415
    code = "unsupported_media_type"


class NotAvailable(LocalrunError):
    """A route whose backing feature is not part of this installation."""

    http_status = 501
    code = "not_implemented"


#: OpenAI's error ``type`` by HTTP status; anything else 5xx is a server_error.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}

RETRY_AFTER_S = 1


def message_of(exc: LocalrunError) -> str:
    """The message a person reads: the error, and the hint that fixes it in brackets."""
    return f"{exc.message} ({exc.hint})" if exc.hint else exc.message


def error_headers(exc: LocalrunError) -> dict[str, str]:
    headers: dict[str, str] = {}
    if isinstance(exc, Overloaded) or exc.http_status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_S)
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="localrun"'
    return headers


@dataclass(frozen=True)
class ErrorShape:
    """How a family writes an error: OpenAI's object here, the default; a family with its own
    wire subclasses it in its folder. ``model`` describes the body in the OpenAPI document."""

    model: type[BaseModel] = OpenAIError

    def status(self, exc: LocalrunError, status: int) -> int:
        """The HTTP status for ``exc`` (already kept to 4xx/5xx)."""
        return status

    def body(self, exc: LocalrunError) -> dict[str, Any]:
        status = exc.http_status
        kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message_of(exc), "type": kind, "param": exc.param, "code": exc.code}}

    def response(self, exc: LocalrunError, status: int) -> Response:
        body = json.dumps(self.body(exc), ensure_ascii=False).encode()
        return Response(body, status_code=status, media_type="application/json", headers=error_headers(exc))


@dataclass(frozen=True)
class PlainMessage(ErrorShape):
    """``{"error": "…"}``: a plain message, as Ollama writes it (and the hub mirror's listing routes)."""

    def body(self, exc: LocalrunError) -> dict[str, Any]:
        return {"error": message_of(exc)}


DEFAULT = ErrorShape()


@dataclass(frozen=True)
class ErrorShapes:
    """Which shape a path's errors take: the first family whose routes hold the path, else the default."""

    default: ErrorShape = DEFAULT
    families: tuple[tuple[Callable[[str], bool], ErrorShape], ...] = ()

    def shape_for(self, path: str) -> ErrorShape:
        return next((shape for owns, shape in self.families if owns(path)), self.default)

    def with_family(self, owns: Callable[[str], bool], shape: ErrorShape) -> ErrorShapes:
        return ErrorShapes(self.default, (*self.families, (owns, shape)))


#: Where an app keeps its :class:`ErrorShapes` (``app.state``).
SHAPES_KEY = "error_shapes"


def shapes_of(app: Any) -> ErrorShapes:
    """The app's table; an app that set none (a bare Starlette app in a test) answers in the default."""
    found = getattr(getattr(app, "state", None), SHAPES_KEY, None)
    return found if isinstance(found, ErrorShapes) else ErrorShapes()


def as_localrun(exc: BaseException, where: str) -> LocalrunError:
    """``exc`` itself, or an internal error that names its type (the traceback goes to the log)."""
    if isinstance(exc, LocalrunError):
        return exc
    log.error("unexpected error %s", where, exc_info=exc)
    return LocalrunError(f"internal error: {type(exc).__name__}", hint="see the server log")


def error_response(exc: BaseException, shape: ErrorShape = DEFAULT, *, path: str = "") -> Response:
    """Turn any exception into the JSON error response of ``shape``'s family (``path`` for the log)."""
    err = as_localrun(exc, f"on {path}")
    status = err.http_status if 400 <= err.http_status <= 599 else 500
    return shape.response(err, shape.status(err, status))


def scope_error_response(exc: BaseException, scope: Scope) -> Response:
    """:func:`error_response` for a request no route has taken yet: the shape its path's family uses."""
    path = scope.get("path", "")
    return error_response(exc, shapes_of(scope.get("app")).shape_for(path), path=path)


def stream_error_line(exc: BaseException, shape: ErrorShape = DEFAULT) -> dict[str, Any]:
    """The error object sent inside a stream that has already started (status 200 is gone)."""
    return shape.body(as_localrun(exc, "during a stream"))


def allowed_methods(routes: Any, scope: Scope) -> list[str]:
    """Every method some route answers on ``scope``'s path (the ``Allow`` of a 405): Starlette's
    own 405 names only the first route that matched the path, not the others on it."""
    from fastapi.routing import iter_route_contexts
    from starlette._utils import get_route_path

    path = get_route_path(scope)
    found: set[str] = set()
    for ctx in iter_route_contexts(routes):
        regex, methods = getattr(ctx, "path_regex", None), ctx.methods
        if methods and regex is not None and regex.match(path):
            found.update(methods)
    if "GET" in found:
        found.add("HEAD")
    return sorted(found)
