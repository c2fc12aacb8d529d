"""OpenAI's embeddings answer, which two families give: ``/v1/embeddings`` and llama-server's
``/embeddings`` when the body is OpenAI's (``input``, not ``content``)."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from fastapi import Request
from pydantic import Field, StringConstraints

from localrun.errors import UnsupportedFeature
from localrun.server.fields import parse_body
from localrun.server.generation import embed_counted, request_stats
from localrun.server.schemas import ModelName, Strict, TokenIds


class EmbeddingRequestBody(Strict):
    model: ModelName
    input: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=2048)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=2048)]
    )
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Field(ge=1, le=65_536)] | None = None
    user: Annotated[str, StringConstraints(max_length=512)] | None = None

    def inputs(self) -> list[str | list[int]]:
        """Each input: a text, or a list of token ids."""
        x = self.input
        if isinstance(x, str):
            return [x]
        if isinstance(x[0], (str, list)):
            return list(x)
        return [list(x)]

    def unsupported(self) -> list[tuple[str, str]]:
        return [("input", "token_prompts")] if any(not isinstance(i, str) for i in self.inputs()) else []


async def parse_and_embed(request: Request) -> dict[str, Any]:
    """The whole OpenAI answer for a request whose body has not been parsed yet (llama-server's route)."""
    return await embedding_list(request, await parse_body(request, EmbeddingRequestBody))


async def embedding_list(request: Request, body: EmbeddingRequestBody) -> dict[str, Any]:
    """Embed ``body``'s inputs and answer OpenAI's ``list`` of ``embedding`` objects."""
    vectors, n_tokens = await embed_counted(request, body.model, body.inputs(), found=body.unsupported())
    name = request_stats(request).model or body.model
    if body.dimensions is not None and vectors and body.dimensions != len(vectors[0]):
        raise UnsupportedFeature(
            f"'dimensions' {body.dimensions} differs from the model's {len(vectors[0])}: truncating embeddings is "
            "not supported",
            hint="leave 'dimensions' out",
            param="dimensions",
        )
    data = []
    for i, vec in enumerate(vectors):
        if body.encoding_format == "base64":
            import numpy as np

            value = base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
        else:
            value = vec
        data.append({"object": "embedding", "index": i, "embedding": value})
    request_stats(request).prompt_tokens = n_tokens
    return {
        "object": "list",
        "data": data,
        "model": name,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }
