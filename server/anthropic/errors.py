"""Anthropic's error shape: ``{"type": "error", "error": {"type": "invalid_request_error", "message": "…"}}``.

The status is the one its clients map to their exception types: a full queue is 529
``overloaded_error`` (the SDK's ``OverloadedError``, which it retries), other 503s stay 503.
A prompt over the context is reworded to Anthropic's own text, ``prompt is too long: N
tokens > M maximum``: Claude Code compacts the conversation only on an error that reads so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from localrun.errors import ContextOverflow, LocalrunError, Overloaded
from localrun.server.anthropic.answers import AnthropicError
from localrun.server.errors import ErrorShape, message_of

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


def owns(path: str) -> bool:
    """Whether ``path`` is one of Anthropic's routes (its errors take this shape)."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


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


@dataclass(frozen=True)
class AnthropicShape(ErrorShape):
    model: type[BaseModel] = AnthropicError

    def status(self, exc: LocalrunError, status: int) -> int:
        return 529 if isinstance(exc, Overloaded) else status

    def body(self, exc: LocalrunError) -> dict[str, Any]:
        status = self.status(exc, exc.http_status if 400 <= exc.http_status <= 599 else 500)
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        message = too_long_message(exc)
        return {"type": "error", "error": {"type": kind, "message": message or message_of(exc)}}


ANTHROPIC = AnthropicShape()
