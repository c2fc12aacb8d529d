"""Conversions more than one wire family needs: a chat message's content parts (OpenAI's, which
llama-server's ``/apply-template`` takes too), inline media (Ollama's ``images``, llama-server's
``multimodal_data``) and llama-server's multimodal completion prompt (its ``/completion`` and
OpenAI's ``/v1/completions``)."""

from __future__ import annotations

from collections.abc import Sequence

from localrun.chat.media import MediaReader, prompt_with_media
from localrun.chat.media_formats import AUDIO, IMAGE
from localrun.server.errors import InvalidRequest
from localrun.server.schemas import ContentPart, MultimodalPrompt
from localrun.types import MEDIA_MARKER, Media, strip_media_markers


def message_content(
    content: str | Sequence[ContentPart] | None, where: str, reader: MediaReader
) -> tuple[str, tuple[Media, ...]]:
    """A message's text and media: text parts joined as they are (llama-server's rule), each image or
    audio part a :data:`MEDIA_MARKER` where it stood; a marker typed by the client is defused."""
    if content is None:
        return "", ()
    if isinstance(content, str):
        return strip_media_markers(content), ()
    texts: list[str] = []
    media: list[Media] = []
    for j, part in enumerate(content):
        here = f"{where}.content[{j}]"
        item = media_part(part, here, reader)
        if item is None:
            texts.append(strip_media_markers(part.text or ""))
        else:
            media.append(item)
            texts.append(MEDIA_MARKER)
    return "".join(texts), tuple(media)


def media_part(part: ContentPart, where: str, reader: MediaReader) -> Media | None:
    """The image or clip of an ``image_url`` / ``input_image`` / ``input_audio`` part; None for other parts."""
    if part.type in ("image_url", "input_image"):
        ref = part.image_url
        if ref is None:
            raise InvalidRequest(f"{where} is an {part.type} part without 'image_url'", param=f"{where}.image_url")
        if isinstance(ref, str):
            return reader.url(ref, where, expect=IMAGE)
        return reader.url(ref.url, where, expect=IMAGE, declared=ref.format)
    if part.type == "input_audio":
        clip = part.input_audio
        if clip is None:
            raise InvalidRequest(f"{where} is an input_audio part without 'input_audio'", param=f"{where}.input_audio")
        if clip.data[:5].lower() == "data:":
            return reader.data_url(clip.data, where, expect=AUDIO)
        return reader.base64(clip.data, where, expect=AUDIO, declared=clip.format)
    return None


def completion_prompt(
    text: str, multimodal: MultimodalPrompt | None, reader: MediaReader, where: str = "prompt"
) -> tuple[str, tuple[Media, ...]]:
    """A completion prompt and its media: llama-server's ``{prompt_string, multimodal_data}`` places
    its items at its ``<__media__>`` markers (:func:`~localrun.chat.media.prompt_with_media`); any
    other prompt is text, in which a typed marker is defused."""
    files = (multimodal.multimodal_data or []) if multimodal is not None else []
    here = f"{where}.multimodal_data"
    media = tuple(inline_media(data, f"{here}[{k}]", reader) for k, data in enumerate(files))
    return prompt_with_media(text, len(media), here), media


def inline_media(data: str, where: str, reader: MediaReader, *, expect: str | None = None) -> Media:
    """An item that must be inline (base64, or a ``data:`` URL): never a URL to fetch."""
    if data[:5].lower() == "data:":
        return reader.data_url(data, where, expect=expect)
    return reader.base64(data, where, expect=expect)
