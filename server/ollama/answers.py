"""Ollama's success bodies (/api), for the OpenAPI document (see server/answers.py)."""

from __future__ import annotations

from typing import Any

from localrun.server.answers import Answer


class OllamaMessage(Answer):
    role: str
    content: str


class OllamaChat(Answer):
    """The final object; with ``stream`` (the default) the answer is NDJSON chunks, the last with ``done: true``."""

    model: str
    created_at: str
    done: bool
    message: OllamaMessage


class OllamaGenerate(Answer):
    """The final object; with ``stream`` (the default) the answer is NDJSON chunks."""

    model: str
    created_at: str
    done: bool
    response: str


class OllamaEmbed(Answer):
    model: str
    embeddings: list[list[float]]


class OllamaEmbedding(Answer):
    embedding: list[float]


class OllamaDetails(Answer):
    format: str | None = None
    family: str | None = None


class OllamaTag(Answer):
    name: str
    model: str
    size: int | None = None
    digest: str
    details: OllamaDetails | dict[str, Any]


class OllamaTags(Answer):
    models: list[OllamaTag]


class OllamaShow(Answer):
    details: OllamaDetails | dict[str, Any]
    model_info: dict[str, Any]
    capabilities: list[str]


class OllamaVersion(Answer):
    version: str


class OllamaStatus(Answer):
    """``/api/pull``'s answer with ``stream: false``; streamed, NDJSON lines of the same shape."""

    status: str


class Empty(Answer):
    """An answer with no body (``/api/delete``)."""
