"""llama-server's success bodies, for the OpenAPI document (see server/answers.py)."""

from __future__ import annotations

from typing import Any

from pydantic import RootModel

from localrun.server.answers import Answer, EmbeddingList


class Tokens(Answer):
    tokens: list[int | dict[str, Any]]  # dicts ({id, piece}) with with_pieces


class Detokenized(Answer):
    content: str


class Templated(Answer):
    prompt: str


class Props(Answer):
    default_generation_settings: dict[str, Any]
    total_slots: int


class CompletionAnswer(Answer):
    """llama-server's ``/completion`` and ``/infill`` answer; with ``stream: true``, SSE events."""

    content: str
    stop: bool


class RerankResult(Answer):
    index: int
    relevance_score: float


class Reranked(Answer):
    results: list[RerankResult]


class NativeEmbedding(Answer):
    index: int
    embedding: list[list[float]] | list[float]


class NativeEmbeddings(RootModel[list[NativeEmbedding] | EmbeddingList]):
    """llama-server's list for a ``content`` body; OpenAI's object for an ``input`` body."""
