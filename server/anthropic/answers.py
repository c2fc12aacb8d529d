"""Anthropic's success and error bodies (/v1/messages), for the OpenAPI document (see server/answers.py)."""

from __future__ import annotations

from typing import Any

from localrun.server.answers import Answer


class AnthropicUsage(Answer):
    input_tokens: int
    output_tokens: int


class AnthropicMessage(Answer):
    """A ``message``; with ``stream: true`` the answer is Anthropic's SSE events."""

    id: str
    type: str
    role: str
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    usage: AnthropicUsage


class TokenCount(Answer):
    input_tokens: int


class AnthropicErrorDetail(Answer):
    type: str
    message: str


class AnthropicError(Answer):
    type: str
    error: AnthropicErrorDetail
