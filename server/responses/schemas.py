"""Request schemas for OpenAI's Responses API (``POST /v1/responses``).

The top level is strict like the chat schemas: every field the official ``openai`` client
can send is declared (plus Codex's ``client_metadata``), anything else is a 400 naming it.
:meth:`ResponsesRequest.unsupported` pairs each field set with the capability it needs,
and fields localrun never honours (``background``, ``conversation``, ``prompt``…) need a
capability no runtime declares, so they are a 400 naming the field and the runtime.

Items and tools are read by their ``type`` through two registries (:data:`ITEM_TYPES`,
:data:`TOOL_TYPES`): the fields localrun uses are typed and bounded; bookkeeping fields
OpenAI keeps adding to a known type (``status``, ``caller``, ``defer_loading``…) are
accepted and not used; an unknown type is a 400 that lists the known ones. Items that
record work of OpenAI's hosted tools (``web_search_call``, ``compaction``…) and hosted
tool definitions (``web_search``, ``file_search``…) are *dropped* by a documented rule:
localrun runs no internet or hosted tool, and Codex sends ``web_search`` on every turn.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from localrun.server.errors import InvalidRequest
from localrun.server.schemas import MaxTokens, ModelName, Strict

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:\-]{1,128}$")]
Id = Annotated[str, StringConstraints(max_length=512)]
Short = Annotated[str, StringConstraints(max_length=512)]


class Lenient(BaseModel):
    """A known item or tool type: used fields typed, OpenAI's bookkeeping fields accepted and unused."""

    model_config = ConfigDict(extra="ignore", frozen=True)


# --- input items ------------------------------------------------------------------------


class MessageItem(Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Annotated[list[dict[str, Any]], Field(max_length=1024)]
    id: Id | None = None


class FunctionCallItem(Lenient):
    type: Literal["function_call"]
    call_id: Id
    name: Name
    arguments: str
    namespace: Name | None = None
    id: Id | None = None


class CallOutputItem(Lenient):
    """``function_call_output`` and ``custom_tool_call_output``: a tool's result."""

    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: Id
    output: str | Annotated[list[dict[str, Any]], Field(max_length=1024)]
    id: Id | None = None


class CustomToolCallItem(Lenient):
    type: Literal["custom_tool_call"]
    call_id: Id
    name: Name
    input: str
    namespace: Name | None = None
    id: Id | None = None


class TextPart(Lenient):
    type: str
    text: str


class ReasoningItem(Lenient):
    type: Literal["reasoning"]
    id: Id | None = None
    summary: Annotated[list[TextPart], Field(max_length=256)] = []
    content: Annotated[list[TextPart], Field(max_length=256)] | None = None
    encrypted_content: str | None = None


ITEM_TYPES: dict[str, type[Lenient]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": CallOutputItem,
    "custom_tool_call": CustomToolCallItem,
    "custom_tool_call_output": CallOutputItem,
    "reasoning": ReasoningItem,
}
"""Item types that reach the model."""

DROPPED_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "code_interpreter_call",
        "image_generation_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "tool_search_call",
        "tool_search_output",
        "compaction",
        "compaction_trigger",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "program",
        "program_output",
        "additional_tools",
    }
)
"""Items that record OpenAI-hosted work (searches, compactions, hosted shells): dropped from the prompt."""


# --- tools --------------------------------------------------------------------------------


class FunctionTool(Lenient):
    type: Literal["function"]
    name: Name
    description: Annotated[str, StringConstraints(max_length=100_000)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomFormat(Lenient):
    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: Annotated[str, StringConstraints(max_length=100_000)] | None = None


class CustomTool(Lenient):
    type: Literal["custom"]
    name: Name
    description: Annotated[str, StringConstraints(max_length=100_000)] | None = None
    format: CustomFormat | None = None


class NamespaceTool(Lenient):
    type: Literal["namespace"]
    name: Name
    description: Annotated[str, StringConstraints(max_length=100_000)] | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=512)]


TOOL_TYPES: dict[str, type[Lenient]] = {"function": FunctionTool, "custom": CustomTool, "namespace": NamespaceTool}
"""Tool types the model is offered."""

HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer",
        "computer_use",
        "computer_use_preview",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
        "programmatic_tool_calling",
    }
)
"""Tools OpenAI runs or formats itself (search, hosted code, MCP, its shell/patch formats): dropped unless forced."""


def parse_typed(value: Any, registry: dict[str, type[Lenient]], dropped: frozenset[str], where: str) -> Lenient | None:
    """One item or tool by its ``type``: the model, None for a dropped type, a 400 for anything else."""
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} must be an object", param=where)
    kind = value.get("type", "message" if "role" in value and registry is ITEM_TYPES else None)
    if isinstance(kind, str) and kind in dropped:
        return None
    model = registry.get(kind) if isinstance(kind, str) else None
    if model is None:
        known = ", ".join(sorted(registry))
        raise InvalidRequest(
            f"{where} has type {kind!r}, which localrun does not read; known types: {known} "
            f"(hosted ones such as {sorted(dropped)[0]!r} are dropped)",
            param=f"{where}.type",
        )
    try:
        return model.model_validate(value, strict=True)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if not isinstance(p, str) or p[:1].islower())
        field = f"{where}.{loc}" if loc else where
        raise InvalidRequest(f"invalid value for {field!r}: {first.get('msg', '')}", param=field) from None


# --- the request ---------------------------------------------------------------------------


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, StringConstraints(max_length=64)] | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: Annotated[str, StringConstraints(max_length=100_000)] | None = None
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
SummaryMode = Literal["auto", "concise", "detailed"]


class ReasoningConfig(Strict):
    effort: Effort | None = None
    summary: SummaryMode | None = None
    generate_summary: SummaryMode | None = None


class StreamOptions(Strict):
    include_obfuscation: bool | None = None


class NamedChoice(Strict):
    """``{"type": "function"|"custom", "name": …}`` or a hosted tool's type (refused: localrun runs none)."""

    type: Annotated[str, StringConstraints(max_length=64)]
    name: Name | None = None
    namespace: Name | None = None
    mode: Literal["auto", "required"] | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=512)] | None = None
    server_label: Short | None = None


INCLUDABLE = frozenset(
    {
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
        "web_search_call.results",
        "web_search_call.action.sources",
        "file_search_call.results",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    }
)
Loose = dict[str, Any]


class ResponsesRequest(Strict):
    model: ModelName
    input: str | Annotated[list[Any], Field(max_length=10_000)] | None = None
    instructions: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    store: bool | None = None
    previous_response_id: Id | None = None
    include: Annotated[list[Short], Field(max_length=32)] | None = None
    tools: Annotated[list[Any], Field(max_length=512)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Annotated[int, Field(ge=1, le=10_000)] | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    metadata: Annotated[dict[Annotated[str, StringConstraints(max_length=64)], Short], Field(max_length=16)] | None = (
        None
    )
    user: Short | None = None
    safety_identifier: Short | None = None
    service_tier: Annotated[str, StringConstraints(max_length=32)] | None = None
    prompt_cache_key: Annotated[str, StringConstraints(max_length=1024)] | None = None
    prompt_cache_retention: Annotated[str, StringConstraints(max_length=32)] | None = None
    prompt_cache_options: Loose | None = None
    #: Codex's own bookkeeping (installation and session ids): accepted, logged at debug level, not used.
    client_metadata: dict[str, Any] | None = None
    # Fields localrun never honours: declared so the answer names them (see unsupported()).
    background: bool | None = None
    background_options: Loose | None = None
    conversation: str | Loose | None = None
    prompt: Loose | None = None
    context_management: list[Any] | None = None
    access_programs: Loose | None = None
    image: Loose | None = None
    moderation: Loose | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, capability) for each field set that needs one; tools and items are added by the route."""
        found: list[tuple[str, str]] = []
        fmt = self.text.format if self.text else None
        if fmt is not None and fmt.type != "text":
            found.append(("text.format", "json_schema"))
        if self.text and self.text.verbosity is not None:
            found.append(("text.verbosity", "verbosity"))
        if self.top_logprobs or "message.output_text.logprobs" in (self.include or ()):
            found.append(("top_logprobs" if self.top_logprobs else "include", "logprobs"))
        if self.truncation == "auto":
            found.append(("truncation", "truncation"))
        if self.background:
            found.append(("background", "background"))
        for name in (
            "background_options",
            "conversation",
            "prompt",
            "context_management",
            "access_programs",
            "image",
            "moderation",
        ):
            if getattr(self, name) is not None:
                found.append((name, name))
        return found

    def check_include(self) -> None:
        for i, value in enumerate(self.include or ()):
            if value not in INCLUDABLE:
                raise InvalidRequest(
                    f"include[{i}] is {value!r}; known values: {', '.join(sorted(INCLUDABLE))}", param=f"include[{i}]"
                )
