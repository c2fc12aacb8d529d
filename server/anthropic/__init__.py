"""Anthropic's Messages API family: /v1/messages and /v1/messages/count_tokens."""

from localrun.server.anthropic.routes import router

__all__ = ["router"]
