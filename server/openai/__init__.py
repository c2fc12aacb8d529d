"""OpenAI's wire family: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings.

``router`` serves them under ``/v1``; ``bare_router`` the same without the prefix, for clients
whose base URL lacks it."""

from localrun.server.openai.routes import bare_router, router

__all__ = ["bare_router", "router"]
