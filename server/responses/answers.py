"""The Responses API's success bodies, for the OpenAPI document (see server/answers.py)."""

from __future__ import annotations

from typing import Any

from localrun.server.answers import Answer


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
