"""Ollama's error shape: a plain message, ``{"error": "…"}``, what the ``ollama`` client reads."""

from __future__ import annotations

from localrun.server.answers import OllamaError
from localrun.server.errors import PlainMessage


def owns(path: str) -> bool:
    """Whether ``path`` is under Ollama's ``/api`` (its errors take this shape)."""
    return path == "/api" or path.startswith("/api/")


OLLAMA = PlainMessage(model=OllamaError)
