"""Strict request schemas for the OpenAI-compatible routes.

Every field the official ``openai`` client can send is declared, so a real client never
meets "unknown field"; anything else is rejected. Fields that need a capability are
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

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

ModelName = Annotated[str, StringConstraints(min_length=1, max_length=512)]
StopWord = Annotated[str, StringConstraints(min_length=1, max_length=512)]
Stop = StopWord | Annotated[list[StopWord], Field(max_length=16)] | None
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
MaxTokens = Annotated[int, Field(ge=1, le=2**31 - 1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Loose(BaseModel):
    """Nested objects we never look into (tool definitions…): any shape, since we reject them whole."""

    model_config = ConfigDict(extra="allow", frozen=True)


ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
Text = Annotated[str, StringConstraints(max_length=100_000)]


class FunctionDef(Strict):
    name: ToolName
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(Strict):
    name: ToolName


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: FunctionName


class CalledFunction(Strict):
    name: ToolName
    arguments: Text


class ToolCallIn(Strict):
    """A call in an assistant turn of the history, as the client got it back."""

    id: Annotated[str, StringConstraints(max_length=256)]
    type: Literal["function"] = "function"
    function: CalledFunction
    index: int | None = None


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


class ContentPart(Strict):
    type: Annotated[str, StringConstraints(max_length=64)]
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None
    cache_control: Any = None


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: Annotated[str, StringConstraints(max_length=256)] | None = None
    tool_calls: Annotated[list[ToolCallIn], Field(max_length=128)] | None = None
    tool_call_id: Annotated[str, StringConstraints(max_length=256)] | None = None
    #: Legacy: the one call an assistant turn made (before ``tool_calls``).
    function_call: CalledFunction | None = None
    refusal: str | None = None
    audio: Loose | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


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
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    user: Annotated[str, StringConstraints(max_length=512)] | None = None
    # Extensions llama.cpp's and vLLM's servers accept; localrun honours them.
    top_k: Annotated[int, Field(ge=0, le=100_000)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Field(ge=0, le=10)] | None = None


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

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, capability) for every field set that needs a capability; the route
        refuses those whose capability the loaded runtime does not declare."""
        found: list[tuple[str, str]] = []
        if self.tools:
            found.append(("tools", "tools"))
        if self.tool_choice not in (None, "none", "auto"):
            found.append(("tool_choice", "tools"))
        if self.functions or self.function_call not in (None, "none", "auto"):
            found.append(("functions" if self.functions else "function_call", "tools"))
        if self.response_format is not None and self.response_format.type != "text":
            found.append(("response_format", "json_schema"))
        if self.logprobs or self.top_logprobs:
            found.append(("logprobs" if self.logprobs else "top_logprobs", "logprobs"))
        if self.modalities and set(self.modalities) - {"text"} or self.audio is not None:
            found.append(("modalities" if self.audio is None else "audio", "audio"))
        for i, m in enumerate(self.messages):
            if m.role in ("tool", "function") or m.tool_calls or m.function_call:
                found.append((f"messages[{i}]", "tools"))
            if isinstance(m.content, list):
                for j, part in enumerate(m.content):
                    if part.type not in ("text", "input_text"):
                        cap = "vision" if part.type in ("image_url", "input_image") else part.type
                        found.append((f"messages[{i}].content[{j}]", cap))
            if m.audio is not None:
                found.append((f"messages[{i}].audio", "audio"))
        found.extend(_common_unsupported(self))
        for name in ("prediction", "web_search_options", "verbosity"):  # reasoning_effort: a budget (reasoning_stream)
            if getattr(self, name) is not None:
                found.append((name, name))
        if self.store:
            found.append(("store", "store"))
        return found


class CompletionRequestBody(Sampled):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | list[int] | list[list[int]]
    echo: bool | None = None
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=128)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        if not isinstance(self.prompt, str) and not (self.prompt and isinstance(self.prompt[0], str)):
            found.append(("prompt", "token prompts"))
        if self.echo:
            found.append(("echo", "echo"))
        if self.suffix:
            found.append(("suffix", "fill-in-the-middle"))
        if self.best_of not in (None, 1):
            found.append(("best_of", "best_of"))
        if self.logprobs is not None:
            found.append(("logprobs", "logprobs"))
        found.extend(_common_unsupported(self))
        return found

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else str(self.prompt[0])


def _common_unsupported(req: Sampled) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if req.n not in (None, 1):
        found.append(("n", "n>1"))
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(req, name):
            found.append((name, name))
    if req.logit_bias:
        found.append(("logit_bias", "logit_bias"))
    return found


class EmbeddingRequestBody(Strict):
    model: ModelName
    input: str | Annotated[list[str], Field(min_length=1, max_length=2048)] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Field(ge=1, le=65_536)] | None = None
    user: Annotated[str, StringConstraints(max_length=512)] | None = None

    def texts(self) -> list[str] | None:
        """The inputs as text; None when they are token ids (not supported)."""
        if isinstance(self.input, str):
            return [self.input]
        if self.input and all(isinstance(x, str) for x in self.input):
            return list(self.input)
        return None
