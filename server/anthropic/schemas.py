"""Request schemas for the Anthropic Messages routes (``/v1/messages``, ``count_tokens``).

Unlike the OpenAI schemas, unknown fields are *accepted*: coding agents (Claude Code above
all) send new fields with every release — ``context_management``, ``output_config``
members, beta block types — and a 400 on each would break them on the day they ship. The
fields localrun knows are typed and bounded as strictly as elsewhere; the unknown ones are
collected by :func:`unknown_fields` and logged once per request by the route, in one place.

What a field needs from the runtime is decided by :meth:`MessagesRequest.unsupported`,
which pairs each field set with a capability, as the OpenAI schemas do: the route answers
400 naming the field and the runtime for one the loaded runtime cannot honour.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

ModelName = Annotated[str, StringConstraints(min_length=1, max_length=512)]
Text = Annotated[str, StringConstraints(max_length=2_000_000)]
ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-]{1,128}$")]
Ident = Annotated[str, StringConstraints(max_length=512)]
StopWord = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class Open(BaseModel):
    """Known fields typed, unknown ones kept (and logged by the route)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class TextBlock(Open):
    type: Literal["text"]
    text: Text
    cache_control: Any = None
    citations: Any = None


class Base64Source(Open):
    type: Literal["base64"]
    media_type: Annotated[str, StringConstraints(max_length=128)] | None = None
    data: str


class URLSource(Open):
    """Fetched only from hosts ``server.fetch_image_urls`` allows (localrun.server.media_fetch)."""

    type: Literal["url"]
    url: str


class FileSource(Open):
    """An id from Anthropic's Files API, which localrun does not have: refused by the converter."""

    type: Literal["file"]
    file_id: Ident


ImageSource = Annotated[Base64Source | URLSource | FileSource, Field(discriminator="type")]


class ImageBlock(Open):
    type: Literal["image"]
    source: ImageSource
    cache_control: Any = None


class DocumentBlock(Open):
    """A PDF or text document: refused by capability (``documents``), which no runtime declares."""

    type: Literal["document"]
    source: Any = None
    cache_control: Any = None
    title: Any = None
    context: Any = None
    citations: Any = None


class ToolUseBlock(Open):
    type: Literal["tool_use", "server_tool_use"]
    id: Ident
    name: ToolName
    #: The call's arguments; a dict keeps its key order, so re-rendering it is byte-stable.
    input: dict[str, Any] = Field(default_factory=dict)
    cache_control: Any = None


class ToolResultBlock(Open):
    type: Literal["tool_result"]
    tool_use_id: Ident
    content: (
        Text
        | Annotated[
            list[Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]], Field(max_length=1000)
        ]
        | None
    ) = None
    is_error: bool | None = None
    cache_control: Any = None


class ThinkingBlock(Open):
    type: Literal["thinking"]
    thinking: Text = ""
    signature: Annotated[str, StringConstraints(max_length=100_000)] | None = None


class RedactedThinkingBlock(Open):
    type: Literal["redacted_thinking"]
    data: Annotated[str, StringConstraints(max_length=1_000_000)] = ""


class OtherBlock(Open):
    """A block type localrun does not know (search results, web search results, …): refused by name."""

    type: Annotated[str, StringConstraints(max_length=64)]

    @field_validator("type")
    @classmethod
    def _not_a_known_type(cls, value: str) -> str:
        # A known block with a bad field must fail as that block, not pass as an unknown one.
        if value in KNOWN_BLOCKS:
            raise ValueError(f"a malformed {value!r} block")
        return value


KNOWN_BLOCKS = frozenset(
    {"text", "image", "document", "tool_use", "server_tool_use", "tool_result", "thinking", "redacted_thinking"}
)

Block = Annotated[
    TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class MessageParam(Open):
    role: Literal["user", "assistant", "system"]
    content: Text | Annotated[list[Block | OtherBlock], Field(max_length=10_000)]


class ToolParam(Open):
    name: ToolName
    description: Annotated[str, StringConstraints(max_length=200_000)] | None = None
    input_schema: dict[str, Any] | None = None
    #: ``custom`` (or absent) for a client tool; Anthropic's own tools have dated types (``web_search_20250305``…).
    type: Annotated[str, StringConstraints(max_length=64)] | None = None
    cache_control: Any = None


class ToolChoice(Open):
    type: Literal["auto", "any", "tool", "none"]
    name: ToolName | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingParam(Open):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None


class OutputFormat(Open):
    type: Literal["json_schema"]
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class OutputConfig(Open):
    effort: Literal["low", "medium", "high", "max", "xhigh"] | None = None
    format: OutputFormat | None = None


class Metadata(Open):
    user_id: Annotated[str, StringConstraints(max_length=512)] | None = None


class CountTokensRequest(Open):
    model: ModelName
    messages: Annotated[list[MessageParam], Field(min_length=1, max_length=10_000)]
    system: Text | Annotated[list[TextBlock], Field(max_length=1000)] | None = None
    tools: Annotated[list[ToolParam], Field(max_length=512)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None
    mcp_servers: list[Any] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, capability) for every field set that needs a capability of the runtime."""
        found: list[tuple[str, str]] = []
        if self.tools:
            found.append(("tools", "tools"))
        if self.tool_choice is not None and self.tool_choice.type in ("any", "tool"):
            found.append(("tool_choice", "tools"))
        if self.output_config is not None and self.output_config.format is not None:
            found.append(("output_config.format", "json_schema"))
        for i, m in enumerate(self.messages):
            if isinstance(m.content, str):
                continue
            for j, block in enumerate(m.content):
                if block.type in ("tool_use", "tool_result"):
                    found.append((f"messages[{i}].content[{j}]", "tools"))
                # Images need what they hold (vision, by the converter's MediaReader); documents need
                # "documents", which no runtime declares.
                if block.type == "document":
                    found.append((f"messages[{i}].content[{j}]", "documents"))
                if isinstance(block, ToolResultBlock) and isinstance(block.content, list):
                    found.extend(
                        (f"messages[{i}].content[{j}].content[{k}]", "documents")
                        for k, part in enumerate(block.content)
                        if part.type == "document"
                    )
        return found


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, Field(ge=1, le=2**31 - 1)]
    stop_sequences: Annotated[list[StopWord], Field(max_length=16)] | None = None
    stream: bool | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0, le=100_000)] | None = None
    metadata: Metadata | None = None
    service_tier: Annotated[str, StringConstraints(max_length=32)] | None = None


def unknown_fields(obj: Any, path: str = "") -> list[str]:
    """Dotted paths of every field the schemas did not declare, for the route's one log line."""
    out: list[str] = []
    if isinstance(obj, BaseModel):
        out.extend(f"{path}{key}" for key in (obj.model_extra or {}))
        for name in type(obj).model_fields:
            out.extend(unknown_fields(getattr(obj, name), f"{path}{name}."))
    elif isinstance(obj, list):
        for i, item in enumerate(obj[:64]):  # enough to name a kind of field; a 10,000-turn history is not walked twice
            out.extend(unknown_fields(item, f"{path[:-1]}[{i}]."))
    return out
