"""The hub mirror's answers, for the OpenAPI document (see server/answers.py)."""

from __future__ import annotations

from typing import Any

from pydantic import RootModel

from localrun.server.answers import OllamaError, OpenAIError

#: The query parameters the mirror's ``/api/models`` routes read.
HUB_QUERY = ("search", "author", "filter", "limit", "blobs", "recursive", "include_prs")


class HubListing(RootModel[list[dict[str, Any]] | dict[str, Any]]):
    """The mirror's ``/api/models``: a list of repos, or one repo's info, tree or refs."""


class HubError(RootModel[OllamaError | OpenAIError]):
    """The mirror's file route: the hub's plain message, or the guards' OpenAI object."""
