"""The success bodies the shared kit's routes answer, and the shapes more than one family uses,
as pydantic models, for the OpenAPI document only.

The routes build their answers as plain dicts (cheap, and shaped by each wire family's own
docs); these models describe those dicts for clients generated from ``/openapi.json``. Each
names the fields a client relies on and allows the rest (``extra="allow"``): an answer that
grows a field stays true to its schema. tests/server/test_schemathesis.py checks real answers
against them, so a model that lies fails there. Each family's own answers are in its folder
(``<family>/answers.py``); here: the :class:`Answer` base, OpenAI's usage and embeddings list
(``/v1/embeddings`` and llama-server's ``/embeddings`` for an ``input`` body), localrun's own
routes (health, admin), and the two error bodies more than one family writes: OpenAI's object,
the default (server/errors.py), and the plain message Ollama and the hub mirror write.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class Usage(Answer):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int


class Embedding(Answer):
    object: str = "embedding"
    index: int
    embedding: list[float] | str  # a base64 string with encoding_format "base64"


class EmbeddingList(Answer):
    object: str = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class Health(Answer):
    """``{"status": "ok"}`` for a probe without the key; the whole status with it (or with no key set)."""

    status: str
    version: str | None = None
    models: list[dict[str, Any]] | None = None


class AdminStatus(Health):
    store: list[str]


class Loaded(Answer):
    loaded: dict[str, Any]


class Unloaded(Answer):
    model: str
    unloaded: bool


class OpenAIErrorDetail(Answer):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(Answer):
    """Every route outside /api and /v1/messages: OpenAI's error object."""

    error: OpenAIErrorDetail


class OllamaError(Answer):
    """Ollama's routes (and the mirror's /api/models): a plain message."""

    error: str
