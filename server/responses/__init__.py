"""OpenAI's Responses API family: /v1/responses, stored responses by id."""

from localrun.server.responses.routes import router

__all__ = ["router"]
