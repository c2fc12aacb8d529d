"""Ollama's chat wire to the core's types and back: messages in (its tool calls carry arguments as
objects, often without an id), the core's OpenAI-shaped calls out."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from localrun.chat.media import MediaReader, ollama_placement
from localrun.chat.tool_calls import arguments_object, openai_calls
from localrun.server.convert import inline_media
from localrun.server.ollama.schemas import ChatBody
from localrun.types import Media, Message, strip_media_markers


def core_messages(body: ChatBody, reader: MediaReader | None = None) -> tuple[Message, ...]:
    """Core messages: Ollama's calls (arguments as objects, often no id) in OpenAI's shape, and each
    message's ``images`` placed by Ollama's rule (:func:`with_images`)."""
    reader = reader or MediaReader()
    out = []
    for i, m in enumerate(body.messages or ()):
        calls = tuple(openai_calls([c.model_dump() for c in m.tool_calls or ()]))
        text, media = with_images(m.content or "", m.images, f"messages[{i}].images", reader)
        out.append(Message(m.role, text, tool_calls=calls, tool_call_id=m.tool_call_id, name=m.tool_name, media=media))
    return tuple(out)


def with_images(
    content: str, images: list[str] | None, where: str, reader: MediaReader
) -> tuple[str, tuple[Media, ...]]:
    """Text and media of a message (or ``/api/generate``'s prompt) and its base64 ``images``: each
    takes the next ``[img]`` in the text, else goes before it (Ollama's server/prompt.go). Ollama's
    ``images`` carry audio too where the model takes it: the reader tells them apart by content."""
    media = [inline_media(data, f"{where}[{k}]", reader) for k, data in enumerate(images or ())]
    return ollama_placement(strip_media_markers(content), media)


def ollama_tool_calls(calls: Iterable[dict[str, Any]], start: int = 0) -> list[dict[str, Any]]:
    """OpenAI-shaped calls as Ollama writes them: arguments as an object (``start``: the first one's index)."""
    out = []
    for i, c in enumerate(calls, start):
        fn = c["function"]
        args = arguments_object(fn["arguments"])
        if isinstance(args, str):  # not JSON: Ollama's clients expect an object
            args = {}
        out.append({"id": c.get("id"), "function": {"index": i, "name": fn["name"], "arguments": args}})
    return out
