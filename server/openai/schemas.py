"""Strict request schemas for the OpenAI-compatible routes.

Every field the official ``openai`` client can send is declared, and the common extensions
of llama.cpp's and vLLM's servers too (``n_predict``, ``cache_prompt``, ``grammar``,
``json_schema``, ``ignore_eos``, ``min_tokens``, ``repetition_penalty``, ``typical_p``,
``chat_template_kwargs``…); an unknown top-level field is ignored and named in a response
header (the policy: :mod:`.fields`). Fields that need a capability are
declared too, and :meth:`unsupported` pairs each one set with the capability it needs
(``tools``, ``json_schema``, ``logprobs``…), so the route can answer "``tools`` is not
supported by the mlc runtime" instead of ignoring them. Tool definitions, tool choices,
tool calls in the history and response formats are typed: a malformed one is a 400 naming
its place, before any model is loaded. Numbers are bounded.

OpenAI's legacy function calling (``functions``, ``function_call``, assistant turns with a
``function_call``, ``role: "function"`` results) is typed the same way and needs the same
``tools`` capability: the route translates it to tools (see ``openai_api``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from localrun.server.errors import InvalidRequest
from localrun.server.schemas import (
    MEDIA_PARTS,
    ChatMessage,
    FunctionDef,
    Loose,
    MaxTokens,
    ModelName,
    MultimodalPrompt,
    Seed,
    SlotId,
    Stop,
    Strict,
    Text,
    TokenIds,
    ToolDef,
    ToolName,
)


class FunctionName(Strict):
    name: ToolName


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: FunctionName


class JsonSchemaFormat(Strict):
    name: Annotated[str, StringConstraints(max_length=64)] = "response"
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def schema_for_sampling(self) -> dict[str, Any] | None:
        """``Sampling.json_schema``: None for text, ``{}`` for any object, else the schema."""
        if self.type == "text":
            return None
        if self.type == "json_object" or self.json_schema is None:
            return {}
        return self.json_schema.schema_ or {}


class StreamOptions(Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class Sampled(Strict):
    """Fields shared by chat and completions."""

    model: ModelName
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    max_tokens: MaxTokens | None = None
    stop: Stop = None
    seed: Seed | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    logit_bias: (
        Annotated[
            dict[Annotated[str, StringConstraints(max_length=16)], Annotated[float, Field(ge=-100, le=100)]],
            Field(max_length=1024),
        ]
        | None
    ) = None
    user: Annotated[str, StringConstraints(max_length=512)] | None = None
    # Extensions llama.cpp's and vLLM's servers accept; localrun honours them.
    top_k: Annotated[int, Field(ge=0, le=100_000)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Field(ge=0, le=10)] | None = None
    repetition_penalty: Annotated[float, Field(ge=0, le=10)] | None = None  # vLLM's name for repeat_penalty
    typical_p: Annotated[float, Field(ge=0, le=1)] | None = None
    n_predict: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = (
        None  # llama.cpp's max_tokens; -1: no limit but the cap
    )
    cache_prompt: bool | None = None  # the prefix cache is always on; accepted either way
    grammar: Annotated[str, StringConstraints(max_length=100_000)] | None = None
    json_schema: dict[str, Any] | None = None  # llama.cpp's top-level schema (response_format's json_schema)
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    id_slot: SlotId | None = None  # llama-server's: run in that slot (llama.cpp), -1 any

    def sampling_knobs(self) -> dict[str, Any]:
        """The knobs shared by chat and completions, for ``make_sampling``."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty if self.repeat_penalty is not None else self.repetition_penalty,
            "typical_p": self.typical_p,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "ignore_eos": self.ignore_eos,
            "min_tokens": self.min_tokens,
            "grammar": self.grammar,
            "n": self.n,
            "logit_bias": logit_bias_pairs(self.logit_bias),
            "id_slot": self.id_slot,
        }

    def token_limit(self, *more: int | None) -> int | None:
        """max_tokens (or what the route adds before it), else n_predict; -1 means "the cap"."""
        for value in (*more, self.max_tokens):
            if value is not None:
                return value
        return None if self.n_predict in (None, -1) else self.n_predict


class ChatCompletionRequest(Sampled):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=10_000)]
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[ToolDef], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Legacy function calling, translated to tools by the route: the same bounds as tools.
    functions: Annotated[list[FunctionDef], Field(max_length=128)] | None = None
    function_call: Literal["none", "auto"] | FunctionName | None = None
    response_format: ResponseFormat | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: Annotated[str, StringConstraints(max_length=32)] | None = None
    modalities: list[Annotated[str, StringConstraints(max_length=16)]] | None = None
    audio: Loose | None = None
    prediction: Loose | None = None
    reasoning_effort: Annotated[str, StringConstraints(max_length=32)] | None = None
    verbosity: Annotated[str, StringConstraints(max_length=16)] | None = None
    web_search_options: Loose | None = None
    prompt_cache_key: Annotated[str, StringConstraints(max_length=1024)] | None = None
    prompt_cache_retention: Annotated[str, StringConstraints(max_length=32)] | None = None
    safety_identifier: Annotated[str, StringConstraints(max_length=512)] | None = None
    # vLLM's chat extensions (chat_template_kwargs carries enable_thinking and the like).
    chat_template_kwargs: (
        Annotated[dict[Annotated[str, StringConstraints(max_length=64)], Any], Field(max_length=64)] | None
    ) = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, capability) for every field set that needs a capability; the route
        refuses those whose capability the loaded runtime does not declare."""
        found = [(field, need) for field, need, asked in self._asks() if asked]
        for i, m in enumerate(self.messages):
            found.extend(_message_needs(i, m))
        found.extend(_common_unsupported(self))
        for name in ("prediction", "web_search_options", "verbosity"):  # reasoning_effort: a budget (server.reasoning)
            if getattr(self, name) is not None:
                found.append((name, name))
        found.extend((field, field) for field, asked in self._extensions() if asked)
        return found

    def _asks(self) -> tuple[tuple[str, str, bool], ...]:
        """(field, capability, whether it is asked) for the top-level fields that need one."""
        fmt = self.response_format
        return (
            ("tools", "tools", bool(self.tools)),
            ("tool_choice", "tools", self.tool_choice not in (None, "none", "auto")),
            (
                "functions" if self.functions else "function_call",
                "tools",
                bool(self.functions) or self.function_call not in (None, "none", "auto"),
            ),
            ("response_format", "json_schema", fmt is not None and fmt.type != "text"),
            ("logprobs" if self.logprobs else "top_logprobs", "logprobs", bool(self.logprobs or self.top_logprobs)),
            (
                "modalities" if self.audio is None else "audio",
                "audio_output",
                bool(self.modalities and set(self.modalities) - {"text"}) or self.audio is not None,
            ),
        )

    def _extensions(self) -> tuple[tuple[str, bool], ...]:
        """The extensions that are their own capability, and whether each is asked."""
        return (
            ("store", bool(self.store)),
            ("chat_template_kwargs", bool(self.chat_template_kwargs)),
            ("add_generation_prompt", self.add_generation_prompt is False),
            ("continue_final_message", bool(self.continue_final_message)),
        )


def _message_needs(i: int, m: ChatMessage) -> list[tuple[str, str]]:
    """What a history message needs: tools for a call or a result, audio output for an audio
    turn, and an unknown content part's own type (media parts: the converter's MediaReader says)."""
    found: list[tuple[str, str]] = []
    if m.role in ("tool", "function") or m.tool_calls or m.function_call:
        found.append((f"messages[{i}]", "tools"))
    if isinstance(m.content, list):
        for j, part in enumerate(m.content):
            if part.type not in ("text", "input_text", *MEDIA_PARTS):
                found.append((f"messages[{i}].content[{j}]", part.type))
    if m.audio is not None:
        found.append((f"messages[{i}].audio", "audio_output"))
    return found


class CompletionRequestBody(Sampled):
    # As the route enforces it (validate.refuse_empty_prompt): an empty prompt only with a suffix (FIM).
    # Said in words, not as a conditional schema: generators (schemathesis among them) cannot use if/then.
    prompt: Annotated[
        str
        | Annotated[list[str], Field(min_length=1, max_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=1)]
        | MultimodalPrompt
        | Annotated[list[MultimodalPrompt], Field(min_length=1, max_length=1)],
        Field(description='The text to complete; empty ("" or [""]) only with a \'suffix\' (fill-in-the-middle).'),
    ]
    echo: bool | None = None
    suffix: Annotated[str, StringConstraints(max_length=1_000_000)] | None = None
    best_of: Annotated[int, Field(ge=1, le=128)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        if self.prompt_ids() is not None:
            found.append(("prompt", "token_prompts"))
        if self.suffix is not None:
            found.append(("suffix", "fill-in-the-middle"))
        if self.best_of not in (None, 1):
            found.append(("best_of", "n"))
            found.append(("best_of", "logprobs"))
        if self.logprobs is not None:
            found.append(("logprobs", "logprobs"))
        found.extend(_common_unsupported(self))
        return found

    def prompt_ids(self) -> list[int] | None:
        """The prompt as token ids, or None when it is text."""
        p = self.multimodal_prompt() or self.prompt
        if isinstance(p, (str, MultimodalPrompt)) or isinstance(p[0], str):
            return None
        first = p[0]
        if isinstance(first, list):
            return list(first)
        return [i for i in p if isinstance(i, int)]

    def prompt_text(self) -> str:
        """The prompt's text as the client sent it (a multimodal prompt's ``prompt_string``, markers and all)."""
        p = self.multimodal_prompt() or self.prompt
        if isinstance(p, MultimodalPrompt):
            return p.prompt_string
        if isinstance(p, str):
            return p
        return p[0] if isinstance(p[0], str) else ""

    def multimodal_prompt(self) -> MultimodalPrompt | None:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], MultimodalPrompt):
            return p[0]
        return p if isinstance(p, MultimodalPrompt) else None


def _common_unsupported(req: Sampled) -> list[tuple[str, str]]:
    from localrun.server.fields import sampling_unsupported

    found = [("n", "n")] if req.n not in (None, 1) else []
    return found + sampling_unsupported(req)


def logit_bias_pairs(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` as ``Sampling.logit_bias``; a key that is no token id is a 400."""
    pairs = []
    for key, value in (bias or {}).items():
        if not key.strip().isdigit():
            raise InvalidRequest(
                f"logit_bias key {key[:40]!r} is not a token id",
                param="logit_bias",
                hint="key the biases by token id (see /tokenize), as OpenAI does",
            )
        pairs.append((int(key), float(value)))
    return tuple(pairs)
