"""Errors in Anthropic's shape, for the ``/v1/messages`` routes.

``{"type": "error", "error": {"type": "invalid_request_error", "message": "…"}}`` with the
status Anthropic's clients map to their exception types: a full queue is 529
``overloaded_error`` (the SDK's ``OverloadedError``, which it retries), other 503s stay 503.

A prompt over the context is reworded to Anthropic's own text, ``prompt is too long: N
tokens > M maximum``: Claude Code compacts the conversation only on an error that reads so.
"""

from __future__ import annotations

import re

from localrun.errors import ContextOverflow, LocalrunError, Overloaded

#: Anthropic's error ``type`` by HTTP status.
_TYPES = {
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
    return f"prompt is too long: {tokens.group(1)} tokens > {limit - 1} maximum"


def anthropic_error_body(exc: LocalrunError) -> dict:
    status = anthropic_status(exc, exc.http_status if 400 <= exc.http_status <= 599 else 500)
    kind = _TYPES.get(status, "api_error")
    message = too_long_message(exc)
    if message is None:
        message = f"{exc.message} ({exc.hint})" if exc.hint else exc.message
    return {"type": "error", "error": {"type": kind, "message": message}}
