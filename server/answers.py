"""The success bodies of every route, as pydantic models, for the OpenAPI document only.

The routes build their answers as plain dicts (cheap, and shaped by each wire family's own
docs); these models describe those dicts for clients generated from ``/openapi.json``. Each
names the fields a client relies on and allows the rest (``extra="allow"``): an answer that
grows a field stays true to its schema. tests/server/test_schemathesis.py checks real answers
against them, so a model that lies fails there.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, RootModel


class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- OpenAI (/v1 and the bare aliases) ---


class ModelObject(Answer):
    id: str
    object: str = "model"
    created: int
    owned_by: str


class ModelList(Answer):
    object: str = "list"
    data: list[ModelObject]


class Usage(Answer):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int


class AssistantMessage(Answer):
    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(Answer):
    index: int
    message: AssistantMessage
    finish_reason: str | None


class ChatCompletion(Answer):
    """``chat.completion``; with ``stream: true`` the answer is SSE ``chat.completion.chunk`` events."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class TextChoice(Answer):
    index: int
    text: str
    finish_reason: str | None


class TextCompletion(Answer):
    """``text_completion``; with ``stream: true`` the answer is SSE events of the same shape."""

    id: str
    object: str
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None


class Embedding(Answer):
    object: str = "embedding"
    index: int
    embedding: list[float] | str  # a base64 string with encoding_format "base64"


class EmbeddingList(Answer):
    object: str = "list"
    data: list[Embedding]
    model: str
    usage: Usage


# --- Ollama (/api) ---


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


# --- llama-server's routes ---


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


# --- Responses and Anthropic ---


class ResponseObject(Answer):
    """A ``response``; with ``stream: true`` the answer is SSE ``response.*`` events."""

    id: str
    object: str
    created_at: int
    status: str
    model: str
    output: list[dict[str, Any]]


class Deleted(Answer):
    id: str
    object: str
    deleted: bool


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


# --- localrun's own routes ---


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


#: The query parameters the mirror's ``/api/models`` routes read.
HUB_QUERY = ("search", "author", "filter", "limit", "blobs", "recursive", "include_prs")


class HubListing(RootModel[list[dict[str, Any]] | dict[str, Any]]):
    """The mirror's ``/api/models``: a list of repos, or one repo's info, tree or refs."""


# --- errors: one shape per family, chosen by path as server/errors.py chooses it ---


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


class AnthropicErrorDetail(Answer):
    type: str
    message: str


class AnthropicError(Answer):
    type: str
    error: AnthropicErrorDetail


class HubError(RootModel[OllamaError | OpenAIError]):
    """The mirror's file route: the hub's plain message, or the guards' OpenAI object."""
