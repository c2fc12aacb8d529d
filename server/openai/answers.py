"""OpenAI's success bodies (/v1 and the bare aliases), for the OpenAPI document (see server/answers.py)."""

from __future__ import annotations

from typing import Any

from localrun.server.answers import Answer, Usage


class ModelObject(Answer):
    id: str
    object: str = "model"
    created: int
    owned_by: str


class ModelList(Answer):
    object: str = "list"
    data: list[ModelObject]


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
