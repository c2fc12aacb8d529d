"""The one place where an error becomes an HTTP response.

Every failure the server reports — a LocalrunError from the core, a request that fails
its schema, a Host the allowlist refuses — goes through :func:`error_response`. Routes
under ``/api/`` answer in Ollama's shape (``{"error": "…"}``, what the ``ollama`` client
reads); ``/v1/messages`` in Anthropic's; everything else in OpenAI's
(``{"error": {"message", "type", "param", "code"}}``).

Anthropic's shape is ``{"type": "error", "error": {"type": "invalid_request_error", "message": "…"}}``
with the status its clients map to their exception types: a full queue is 529
``overloaded_error`` (the SDK's ``OverloadedError``, which it retries), other 503s stay 503.
A prompt over the context is reworded to Anthropic's own text, ``prompt is too long: N
tokens > M maximum``: Claude Code compacts the conversation only on an error that reads so.
"""

from __future__ import annotations

import json
import logging
import re

from starlette.responses import Response

from localrun.errors import ContextOverflow, LocalrunError, Overloaded

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

#: Anthropic's error ``type`` by HTTP status.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}

_PROMPT_TOKENS = re.compile(r"(\d+) tokens")
_CONTEXT = re.compile(r"holds (\d+)|(\d+)-token context")

RETRY_AFTER_S = 1


def is_ollama_path(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def is_anthropic_path(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def anthropic_status(exc: LocalrunError, status: int) -> int:
    return 529 if isinstance(exc, Overloaded) else status


def too_long_message(exc: LocalrunError) -> str | None:
    """``prompt is too long: N tokens > M maximum`` when the runtime's message names both numbers."""
    if not isinstance(exc, ContextOverflow):
        return None
    tokens, context = _PROMPT_TOKENS.search(exc.message), _CONTEXT.search(exc.message)
    if tokens is None or context is None:
        return None
    limit = int(context.group(1) or context.group(2))
    hint = f" ({exc.hint})" if exc.hint else ""  # the option that fixes it (localrun/activity.py)
    return f"prompt is too long: {tokens.group(1)} tokens > {limit - 1} maximum{hint}"


def anthropic_error_body(exc: LocalrunError) -> dict:
    status = anthropic_status(exc, exc.http_status if 400 <= exc.http_status <= 599 else 500)
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    message = too_long_message(exc)
    if message is None:
        message = f"{exc.message} ({exc.hint})" if exc.hint else exc.message
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body(exc: LocalrunError, *, ollama: bool, anthropic: bool = False) -> dict:
    """The JSON an error becomes: Ollama's plain string, Anthropic's or OpenAI's object."""
    if anthropic:
        return anthropic_error_body(exc)
    message = f"{exc.message} ({exc.hint})" if exc.hint else exc.message
    if ollama:
        return {"error": message}
    status = exc.http_status
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": exc.param, "code": exc.code}}


def error_headers(exc: LocalrunError) -> dict[str, str]:
    headers: dict[str, str] = {}
    if isinstance(exc, Overloaded) or exc.http_status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_S)
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="localrun"'
    return headers


def error_response(exc: BaseException, *, path: str) -> Response:
    """Turn any exception into the JSON error response for ``path``'s API flavour."""
    if not isinstance(exc, LocalrunError):
        log.error("unexpected error on %s", path, exc_info=exc)
        exc = LocalrunError(f"internal error: {type(exc).__name__}", hint="see the server log")
    status = exc.http_status if 400 <= exc.http_status <= 599 else 500
    if is_anthropic_path(path):
        status = anthropic_status(exc, status)
    body = json.dumps(
        error_body(exc, ollama=is_ollama_path(path), anthropic=is_anthropic_path(path)), ensure_ascii=False
    ).encode()
    return Response(body, status_code=status, media_type="application/json", headers=error_headers(exc))


def stream_error_line(exc: BaseException, *, ollama: bool, anthropic: bool = False) -> dict:
    """The error object sent inside a stream that has already started (status 200 is gone)."""
    if not isinstance(exc, LocalrunError):
        log.error("unexpected error during a stream", exc_info=exc)
        exc = LocalrunError(f"internal error: {type(exc).__name__}", hint="see the server log")
    return error_body(exc, ollama=ollama, anthropic=anthropic)
