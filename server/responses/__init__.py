"""OpenAI's Responses API family: /v1/responses, stored responses by id; ``bare_router`` the same without /v1."""

from localrun.server.responses.routes import bare_router, router

__all__ = ["bare_router", "router"]
