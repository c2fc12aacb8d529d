"""The shape of each event a streamed answer sends, for the OpenAPI document.

A ``text/event-stream`` answer is a sequence of events; OpenAPI 3.2's ``itemSchema`` describes
one of them, and the document gives every SSE route one (schemathesis and other tools read it
under 3.1 documents too). An event is an object with ``data`` (a string) and, where the API
names its events, ``event``; ``data`` holds JSON (``contentMediaType`` and ``contentSchema``
say which), or, on the OpenAI routes, the closing ``[DONE]``. A stream that fails after it
started ends with an error event in the family's shape (server/streams.py), so every data
schema admits ``{"error": ...}`` too. tests/server/test_openapi_streams.py validates real
streams of every SSE route against these schemas.
"""

from __future__ import annotations

from typing import Any

_ERROR: dict[str, Any] = {"type": "object", "required": ["error"]}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


_HEAD = ["id", "object", "created", "model", "choices"]
_CHAT_CHUNK = _object(_HEAD, object={"const": "chat.completion.chunk"}, choices={"type": "array"})
_TEXT_CHUNK = _object(_HEAD, object={"const": "text_completion"}, choices={"type": "array"})
_ANTHROPIC_TYPES = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
]
_ANTHROPIC = _object(["type"], type={"enum": _ANTHROPIC_TYPES})
_RESPONSES = _object(["type"], type={"type": "string", "pattern": "^(response\\.|error$)"})
_NATIVE = _object(["content"], content={"type": "string"}, stop={"type": "boolean"})
_STATUS = _object(["status"], status={"type": "string"})

#: Path -> (the JSON an event's data holds, whether ``[DONE]`` ends the stream, the event names if named).
EVENTS: dict[str, tuple[dict[str, Any], bool, list[str] | None]] = {
    "/v1/chat/completions": (_CHAT_CHUNK, True, None),
    "/chat/completions": (_CHAT_CHUNK, True, None),
    "/v1/completions": (_TEXT_CHUNK, True, None),
    "/completions": (_TEXT_CHUNK, True, None),
    "/v1/messages": (_ANTHROPIC, False, _ANTHROPIC_TYPES),
    "/v1/responses": (_RESPONSES, False, None),
    "/responses": (_RESPONSES, False, None),
    "/completion": (_NATIVE, False, None),
    "/infill": (_NATIVE, False, None),
    "/admin/events": (_STATUS, False, ["status"]),
}


def item_schema(path: str) -> dict[str, Any]:
    """One event of ``path``'s stream (a permissive one for a path not listed)."""
    data, done, names = EVENTS.get(path, ({}, False, None))
    json_data: dict[str, Any] = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [data, _ERROR]} if data else {},
    }
    event: dict[str, Any] = {"type": "string"}
    if names is not None:
        event["enum"] = names
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "event": event,
            "data": {"anyOf": [{"const": "[DONE]"}, json_data]} if done else json_data,
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
    }
