"""Request schemas of llama-server's own routes (its ``tools/server/README.md``): ``/completion``,
``/infill``, ``/tokenize``, ``/detokenize``, ``/apply-template``, ``/rerank`` and the native
``/embeddings``. Typed and bounded like the OpenAI ones; unknown top-level fields follow the
field policy (:mod:`.fields`). ``model`` is optional, as llama-server serves one model: the
route picks the loaded one (:func:`.llama_routes.pick_model`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints

from localrun.server.errors import InvalidRequest
from localrun.server.schemas import (
    ChatMessage,
    ModelName,
    MultimodalPrompt,
    Seed,
    SlotId,
    Stop,
    Strict,
    TokenIds,
)

Text = Annotated[str, StringConstraints(max_length=1_000_000)]
#: llama-server's logit_bias: ``[[token, bias], …]`` (``false`` bans the token) or ``{"token": bias}``.
LogitBias = (
    Annotated[list[Annotated[list[int | float | bool], Field(min_length=2, max_length=2)]], Field(max_length=1024)]
    | Annotated[dict[Annotated[str, StringConstraints(max_length=16)], float | bool], Field(max_length=1024)]
)


class NativeSampling(Strict):
    """The sampling fields ``/completion`` and ``/infill`` share."""

    model: ModelName | None = None
    stream: bool | None = None
    n_predict: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    stop: Stop = None
    temperature: Annotated[float, Field(ge=0, le=100)] | None = None
    top_k: Annotated[int, Field(ge=0, le=100_000)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    typical_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Field(ge=0, le=10)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    seed: Seed | None = None
    grammar: Annotated[str, StringConstraints(max_length=100_000)] | None = None
    json_schema: dict[str, Any] | None = None
    n_probs: Annotated[int, Field(ge=0, le=20)] | None = None
    cache_prompt: bool | None = None
    ignore_eos: bool | None = None
    logit_bias: LogitBias | None = None
    id_slot: SlotId | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        from localrun.server.fields import sampling_unsupported

        found = sampling_unsupported(self)
        if self.n_probs:
            found.append(("n_probs", "logprobs"))
        return found

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """``Sampling.logit_bias``; ``false`` bans (-100, which the sampler turns into -inf)."""
        items = self.logit_bias.items() if isinstance(self.logit_bias, dict) else (self.logit_bias or ())
        pairs = []
        for key, value in items:
            if isinstance(key, bool) or not str(key).strip().lstrip("-").isdigit():
                raise InvalidRequest(
                    f"logit_bias key {str(key)[:40]!r} is not a token id",
                    param="logit_bias",
                    hint="key the biases by token id (see /tokenize)",
                )
            bias = -100.0 if value is False else 0.0 if value is True else float(value)
            if not -100 <= bias <= 100:
                raise InvalidRequest(f"logit_bias {bias} is outside -100..100", param="logit_bias")
            pairs.append((int(key), bias))
        return tuple(pairs)


class NativeCompletion(NativeSampling):
    # As the route enforces it (validate.refuse_empty_prompt): there must be something to complete.
    model_config = ConfigDict(json_schema_extra={"allOf": [{"properties": {"prompt": {"not": {"const": ""}}}}]})
    #: Text, token ids, or ``{"prompt_string": …, "multimodal_data": [base64, …]}`` (images and audio).
    prompt: Text | TokenIds | MultimodalPrompt


class ExtraChunk(Strict):
    filename: Annotated[str, StringConstraints(max_length=1024)] = ""
    text: Text = ""


class InfillBody(NativeSampling):
    input_prefix: Text = ""
    input_suffix: Text = ""
    input_extra: Annotated[list[ExtraChunk], Field(max_length=256)] = []
    prompt: Text = ""


class TokenizeBody(Strict):
    model: ModelName | None = None
    content: Text
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeBody(Strict):
    model: ModelName | None = None
    tokens: Annotated[list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(max_length=1_000_000)]


class ApplyTemplateBody(Strict):
    model: ModelName | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=10_000)]
    chat_template_kwargs: (
        Annotated[dict[Annotated[str, StringConstraints(max_length=64)], Any], Field(max_length=64)] | None
    ) = None
    add_generation_prompt: bool = True


Document = Annotated[str, StringConstraints(max_length=100_000)]


class RerankBody(Strict):
    # As docs() enforces it: exactly one of documents (llama-server, Jina, Cohere) or texts (TEI), not empty.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "oneOf": [
                {"required": [name], "properties": {name: {"type": "array", "minItems": 1}}}
                for name in ("documents", "texts")
            ]
        },
    )
    model: ModelName | None = None
    query: Document
    documents: Annotated[list[Document], Field(max_length=1024)] | None = None
    texts: Annotated[list[Document], Field(max_length=1024)] | None = None  # TEI's name for documents
    top_n: Annotated[int, Field(ge=1, le=1024)] | None = None
    return_documents: bool | None = None

    def docs(self) -> list[str]:
        if self.documents is not None and self.texts is not None:
            raise InvalidRequest("send 'documents' or 'texts', not both", param="texts")
        docs = self.documents if self.documents is not None else self.texts
        if docs is None:
            raise InvalidRequest("missing required field 'documents'", param="documents")
        if not docs:  # llama-server's answer too: there is nothing to rank
            field = "documents" if self.documents is not None else "texts"
            raise InvalidRequest(f"{field!r} must be a non-empty list of strings", param=field)
        return list(docs)


class NativeEmbeddingBody(Strict):
    model: ModelName | None = None
    content: Text | TokenIds | Annotated[list[Text | TokenIds], Field(min_length=1, max_length=2048)]
    #: 2 (Euclidean, llama-server's default) is what localrun does to pooled vectors; other norms are a 400.
    embd_normalize: Literal[2] | None = None

    def inputs(self) -> list[str | list[int]]:
        c = self.content
        if isinstance(c, str):
            return [c]
        if c and isinstance(c[0], int):  # one prompt of token ids
            return [[i for i in c if isinstance(i, int)]]
        return [i for i in c if not isinstance(i, int)]
