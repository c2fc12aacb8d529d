"""Requests and answers of an upstream in OpenAI's wire shape: messages, sampling fields,
log-probabilities and streamed tool-call deltas. Kind-specific choices (llama.cpp-style
sampling knobs) follow the upstream's :class:`~localrun.runtimes.openai_compat.kinds.Kind`.

A message with media goes as OpenAI's content parts, in prompt order: text between markers,
each image an ``image_url`` part with a ``data:`` URL, each clip an ``input_audio`` part
(base64, ``wav`` or ``mp3``). Only sessions that declare ``vision`` / ``audio`` are sent
them (the server's 400 rule refuses the rest), and OpenAI's completions API has no media
field, so a completion with media is refused here."""

from __future__ import annotations

import base64
import json
from typing import Any

from localrun.errors import UnsupportedFeature
from localrun.runtimes.openai_compat.kinds import Kind
from localrun.types import MEDIA_MARKER, ChatRequest, CompletionRequest, Media, Message, Sampling

#: An image's type when the client declared none (the upstream sniffs the bytes; the URL needs one).
_DEFAULT_IMAGE_MIME = "image/png"


def refuse_media(req: ChatRequest | CompletionRequest, *, runtime: str, model: str, why: str) -> None:
    """For a runtime that declares neither ``vision`` nor ``audio``: media are refused rather than
    dropped (the server refuses them first; this is for callers that skip it, the CLI and the TUI).

    Raises:
        UnsupportedFeature: the request carries an image or a clip.
    """
    if req.media:
        kind = req.media[0].kind
        raise UnsupportedFeature(
            f"{kind} input is not supported by the {runtime} runtime serving {model}: {why}",
            param="images" if kind == "image" else "audio",
            hint="load a GGUF with its projector on llama.cpp (localrun pull a repo that has an mmproj file)",
        )


def sampling_to_openai(s: Sampling) -> dict[str, Any]:
    """The OpenAI request fields for ``s``.

    OpenAI's protocol (and MLC's copy of it) has no ``top_k``, ``min_p`` or multiplicative
    repeat penalty; MLC ignores fields it does not know, so they are left out rather than
    sent to be dropped.
    """
    body: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p}
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if s.max_tokens is not None:
        body["max_tokens"] = s.max_tokens
    return body


def _media_part(item: Media) -> dict[str, Any]:
    data = base64.b64encode(item.data).decode("ascii")
    if item.kind == "audio":
        fmt = "mp3" if item.mime and ("mpeg" in item.mime or "mp3" in item.mime) else "wav"
        return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}
    mime = item.mime if item.mime and item.mime.startswith("image/") else _DEFAULT_IMAGE_MIME
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}


def content_parts(m: Message) -> list[dict[str, Any]]:
    """``m``'s text and media as OpenAI content parts, each media item where its marker was."""
    texts = m.content.split(MEDIA_MARKER)
    parts: list[dict[str, Any]] = [{"type": "text", "text": texts[0]}] if texts[0] else []
    for item, text in zip(m.media, texts[1:], strict=False):
        parts.append(_media_part(item))
        if text:
            parts.append({"type": "text", "text": text})
    for item in m.media[len(texts) - 1 :]:  # more items than markers: the rest after the text
        parts.append(_media_part(item))
    return parts


def openai_messages(req: ChatRequest) -> list[dict[str, Any]]:
    """Core messages in OpenAI's wire shape, tool calls, results and media included."""
    out = []
    for m in req.messages:
        msg: dict[str, Any] = {"role": m.role, "content": content_parts(m) if m.media else m.content}
        if m.tool_calls:
            msg["tool_calls"] = list(m.tool_calls)
            msg["content"] = m.content or None
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.name is not None and m.role in ("tool", "user", "assistant"):
            msg["name"] = m.name
        out.append(msg)
    return out


def sampling_body(s: Sampling, kind: Kind, *, chat: bool) -> dict[str, Any]:
    """Sampling as the upstream's request fields; llama.cpp-style knobs only where the kind takes them."""
    body = sampling_to_openai(s)
    if kind.extra_sampling:
        body.update(top_k=s.top_k, min_p=s.min_p)
        if s.repeat_penalty != 1.0:
            body["repetition_penalty"] = s.repeat_penalty
    if s.json_schema is not None:
        body["response_format"] = (
            {"type": "json_object"}
            if not s.json_schema
            else {"type": "json_schema", "json_schema": {"name": "answer", "schema": s.json_schema}}
        )
    if s.logprobs is not None:
        if chat:
            body["logprobs"] = True
            if s.logprobs:
                body["top_logprobs"] = s.logprobs
        else:
            body["logprobs"] = s.logprobs
    return body


def chat_body(req: ChatRequest, kind: Kind, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": openai_messages(req), **sampling_body(req.sampling, kind, chat=True)}
    if req.tools:
        body["tools"] = list(req.tools)
    if req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    return body


def completion_body(req: CompletionRequest, kind: Kind, model: str) -> dict[str, Any]:
    if req.media:
        raise UnsupportedFeature(
            f"media in a completion cannot be sent to the {kind.name} upstream: OpenAI's completions API has no "
            "field for them",
            param="multimodal_data",
            hint="send the image in a chat request (an image_url content part)",
        )
    return {"model": model, "prompt": req.prompt, **sampling_body(req.sampling, kind, chat=False)}


def completion_logprobs(lp: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The completions API's parallel lists as ``Chunk.logprobs`` entries."""
    tokens = lp.get("tokens") or []
    values = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    out = []
    for i, token in enumerate(tokens):
        entry = {"token": token, "logprob": values[i] if i < len(values) else None, "bytes": list(str(token).encode())}
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else None
        if top:
            entry["top_logprobs"] = [{"token": t, "logprob": v, "bytes": list(str(t).encode())} for t, v in top.items()]
        out.append(entry)
    return tuple(out)


def chat_logprobs(lp: Any) -> tuple[dict[str, Any], ...]:
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        return tuple(lp["content"])
    if isinstance(lp, dict) and "tokens" in lp:
        return completion_logprobs(lp)
    return ()


class ToolCalls:
    """Tool-call deltas of a stream, joined by their index into whole calls."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, Any]] = {}

    def add(self, deltas: list[dict[str, Any]]) -> None:
        for d in deltas:
            call = self.calls.setdefault(
                int(d.get("index", len(self.calls))),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if d.get("id"):
                call["id"] = d["id"]
            fn = d.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            args = fn.get("arguments")
            call["function"]["arguments"] += args if isinstance(args, str) else (json.dumps(args) if args else "")

    def done(self) -> tuple[dict[str, Any], ...]:
        return tuple(self.calls[i] for i in sorted(self.calls))
