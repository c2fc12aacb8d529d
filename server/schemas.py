"""Schema primitives every wire family's request bodies are built from.

Bounded names, stop words, seeds and token limits; the ``Strict`` base (unknown nested fields are
a 400) and ``Loose`` (shapes taken whole); OpenAI's tool definition, which Ollama's ``tools`` use
too; OpenAI's chat message and content parts, which llama-server's ``/apply-template`` takes as
they are; llama-server's multimodal prompt and slot id, which its routes and OpenAI's
``/v1/completions`` share; and Ollama's ``keep_alive``, which ``/admin/load`` takes as well.
A family's own shapes live in its folder (``<family>/schemas.py``).
"""

from __future__ import annotations

import re
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


class CalledFunction(Strict):
    name: ToolName
    arguments: Text


class ToolCallIn(Strict):
    """A call in an assistant turn of the history, as the client got it back."""

    id: Annotated[str, StringConstraints(max_length=256)]
    type: Literal["function"] = "function"
    function: CalledFunction
    index: int | None = None


class ImageURL(Strict):
    """``image_url``'s object form: a ``data:`` URL (or an ``http(s)://`` one, fetched only from allowed hosts)."""

    url: str
    detail: Annotated[str, StringConstraints(max_length=16)] | None = None  # accepted; a projector has one resolution
    format: Annotated[str, StringConstraints(max_length=128)] | None = None  # LiteLLM's declared type


class InputAudio(Strict):
    data: str
    format: Annotated[str, StringConstraints(max_length=16)] | None = None  # wav | mp3 (flac taken too)


class ContentPart(Strict):
    type: Annotated[str, StringConstraints(max_length=64)]
    text: str | None = None
    image_url: str | ImageURL | None = None
    input_audio: InputAudio | None = None
    file: Any = None
    refusal: str | None = None
    cache_control: Any = None


#: Content part types that carry an image or audio clip (``input_image`` is the Responses spelling).
MEDIA_PARTS = ("image_url", "input_image", "input_audio")


class ChatMessage(Strict):
    # As server/openai/convert.py enforces it: a legacy function result names its function.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "if": {"properties": {"role": {"const": "function"}}, "required": ["role"]},
            "then": {"required": ["name"], "properties": {"name": {"type": "string"}}},
        },
    )
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


#: llama-server's ``id_slot``: a slot of the llama.cpp context, or -1 for any (bounded: 256 slots at most).
SlotId = Annotated[int, Field(ge=-1, le=255)]

TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(min_length=1, max_length=1_000_000)]


class MultimodalPrompt(Strict):
    """llama-server's prompt object: text holding one ``<__media__>`` marker per ``multimodal_data``
    item (base64 files), the n-th marker taking the n-th item; without markers they follow the text."""

    prompt_string: Annotated[str, StringConstraints(max_length=1_000_000)]
    multimodal_data: Annotated[list[str], Field(max_length=1000)] | None = None


#: Ollama's ``keep_alive`` (admin's too): seconds, or a Go duration such as ``"5m"``.
#: What keep_alive_seconds takes as text, for the document (the route's own check gives the clearer 400):
#: empty, a number of seconds, or a Go duration such as 30s, 5m or -1h30m.
KEEP_ALIVE_PATTERN = (
    r"^\s*(|[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?"
    r"|[+-]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h))+)\s*$"
)
KeepAlive = (
    Annotated[float, Field(ge=-1e12, le=1e12)]
    | Annotated[str, StringConstraints(max_length=64), Field(json_schema_extra={"pattern": KEEP_ALIVE_PATTERN})]
    | None
)


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: float | str | None) -> float | None:
    """Ollama's keep_alive: a number of seconds or a Go duration ("5m", "1h30m", "-1").

    Returns None (server default), 0 (unload after the request) or a negative number (keep
    forever). Raises ValueError on anything else.
    """
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else -1.0
    text = value.strip()
    if text == "":
        return None
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None:  # Ollama accepts a bare number in a string as seconds
        if number != number or abs(number) == float("inf"):
            raise ValueError(f"keep_alive {value!r} is not a finite number")
        return number if number >= 0 else -1.0
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in "+-" else text
    pos, total = 0, 0.0
    while pos < len(body):
        m = _DURATION_PART.match(body, pos)
        if not m:
            raise ValueError(f"keep_alive {value!r} is not a duration like 30s, 5m, 1h30m or a number of seconds")
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not body:
        raise ValueError(f"keep_alive {value!r} is not a duration")
    return -1.0 if sign < 0 else total
