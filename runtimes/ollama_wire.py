"""Ollama's wire format for what a session honours beyond plain sampling: tools, structured
outputs and log-probabilities, and the stream shaping that carries them onto chunks.

Kept out of :mod:`.ollama` so the runtime stays about the HTTP client, loading and the
session's life. Every rule here follows Ollama's ``docs/api.md``:

* **Capabilities** (:func:`session_capabilities`). ``tools`` only when ``/api/show`` lists
  it for the model (an Ollama too old to send a ``capabilities`` list is taken not to
  support tools); ``json_schema`` for a completion model on Ollama 0.5.0 or newer (the
  first with structured outputs); ``logprobs`` for a completion model on Ollama 0.12.11 or
  newer (the first that returns them: older ones ignore the field and would answer without).
  A version that does not parse, or a source build's ``0.0.0``, counts as current. Should
  such an Ollama answer a logprobs request without any, the stream ends in
  :class:`~localrun.errors.UnsupportedFeature` naming the version needed, never in a
  silently empty list (an answer that is only tool calls may come without entries: Ollama
  sends text's log-probabilities, and such an answer has none).
* **Tools** (:func:`offered_tools`, :func:`ollama_messages`). Definitions go as they come
  (Ollama takes OpenAI's shape). Ollama has no ``tool_choice``: ``"none"`` leaves the
  tools out, ``"auto"`` sends them, and ``"required"`` or a named function is refused
  (param ``tool_choice``) since Ollama cannot force a call. History turns go in Ollama's
  shape: an assistant's calls with arguments as objects (a string that is not a JSON
  object is refused, naming the message), a tool result with ``tool_name`` — the name of
  the call it answers, found by ``tool_call_id`` — and the ids too, which newer Ollama
  versions use and older ones ignore.
* **Images and audio** (:func:`check_media`, :func:`ollama_messages`, :func:`raw_prompt`). A
  session declares ``vision`` / ``audio`` when ``/api/show`` lists them for the model. Media go
  base64 in a message's (or ``/api/generate``'s) ``images`` list, audio too: Ollama tells a
  clip from a picture by its bytes (``llm.DetectMediaKind``). Each :data:`MEDIA_MARKER` becomes
  the tag Ollama places them by: ``[img]`` in chat content (its ``chatPrompt`` replaces each
  with the next item's ``[img-N]``), ``[img-N]`` itself in a raw prompt, which no template
  touches.
* **Structured outputs**: ``format`` is ``"json"`` for json_object mode (``json_schema ==
  {}``) and the schema itself otherwise. A GBNF grammar cannot be honoured by Ollama and
  is refused (param ``grammar``).
* **Answers** (:func:`shape_ollama_stream`). Text goes through the shared
  :func:`~localrun.runtimes.openai_compat.client.shape_stream` (stop strings, cancel, usage).
  Calls Ollama sends (arguments as objects, sometimes with an ``id``) are gathered and
  put on the last chunk in OpenAI's shape (arguments a JSON string, ``call_…`` ids) with
  ``finish_reason="tool_calls"``; log-probability entries ride on the next chunk emitted,
  in localrun's shape (``token``, ``logprob``, ``bytes``, ``top_logprobs``).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from localrun.chat import tools as toolcalls
from localrun.chat.tool_calls import openai_calls
from localrun.errors import UnsupportedFeature
from localrun.runtimes.pieces import Piece, shape_stream
from localrun.types import AUDIO, MEDIA_MARKER, VISION, Cancel, ChatRequest, Chunk, Media, Message, Sampling, Usage

#: The first Ollama with structured outputs (``format`` as a JSON schema).
MIN_JSON_SCHEMA = (0, 5, 0)
#: The first Ollama that returns log-probabilities.
MIN_LOGPROBS = (0, 12, 11)

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: Any) -> tuple[int, int, int] | None:
    """``"0.12.11"`` → ``(0, 12, 11)``; None for what does not parse or a source build's ``0.0.0``."""
    m = _VERSION.match(str(text or "").strip())
    if not m:
        return None
    version = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    return None if version == (0, 0, 0) else version


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def session_capabilities(caps: Sequence[str] | None, version: tuple[int, int, int] | None) -> frozenset[str]:
    """What a session declares, from ``/api/show``'s ``capabilities`` (None: an Ollama before
    0.6 that sends none) and the server's version (None: unknown, taken as current)."""
    out: set[str] = set()
    if caps is None or "embedding" in caps:
        out.add("embeddings")
    completion = caps is None or "completion" in caps
    if completion and caps is not None and "tools" in caps:
        out.add("tools")
    if completion and (version is None or version >= MIN_JSON_SCHEMA):
        out.add("json_schema")
    if completion and (version is None or version >= MIN_LOGPROBS):
        out.add("logprobs")
    out.update(c for c in (VISION, AUDIO) if caps is not None and c in caps)
    return frozenset(out)


# --- into the request --------------------------------------------------------------------


def check_sampling(sampling: Sampling, capabilities: frozenset[str], *, model: str) -> None:
    """Refuse what this session cannot honour, before anything is sent.

    The server refuses undeclared capabilities itself; this is for callers that skip it
    (CLI, TUI) and for what Ollama never honours (grammars).
    """
    if sampling.grammar is not None:
        raise UnsupportedFeature(
            f"Ollama cannot constrain {model}'s output with a GBNF grammar",
            param="grammar",
            hint="use a JSON schema (response_format / format) instead",
        )
    if sampling.json_schema is not None and "json_schema" not in capabilities:
        raise UnsupportedFeature(
            f"'response_format' is not supported by the ollama runtime serving {model}: "
            f"structured outputs need Ollama {_dotted(MIN_JSON_SCHEMA)} or newer",
            param="response_format",
            hint="upgrade Ollama or remove the field from the request",
        )
    if sampling.logprobs is not None and "logprobs" not in capabilities:
        raise UnsupportedFeature(
            f"'logprobs' is not supported by the ollama runtime serving {model}: "
            f"log-probabilities need Ollama {_dotted(MIN_LOGPROBS)} or newer",
            param="logprobs",
            hint="upgrade Ollama or remove the field from the request",
        )


def sampling_fields(sampling: Sampling) -> dict[str, Any]:
    """The top-level body fields (not ``options``) for structured output and logprobs."""
    body: dict[str, Any] = {}
    if sampling.json_schema is not None:
        body["format"] = sampling.json_schema if sampling.json_schema else "json"
    if sampling.logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = int(sampling.logprobs)
    return body


def check_media(media: Sequence[Media], capabilities: frozenset[str], *, model: str) -> None:
    """Refuse media Ollama does not list this model as taking, before anything is sent.

    Raises:
        UnsupportedFeature: an image for a model without ``vision``, a clip without ``audio``.
    """
    for m in media:
        needed = VISION if m.kind == "image" else AUDIO
        if needed not in capabilities:
            raise UnsupportedFeature(
                f"{m.kind} input is not supported by the ollama runtime serving {model}: "
                f"Ollama does not list the {needed!r} capability for this model",
                param="images",
                hint=f"use a model Ollama lists with {needed!r} (ollama show MODEL), or leave the {m.kind} out",
            )


def _b64(media: Sequence[Media]) -> list[str]:
    return [base64.b64encode(m.data).decode("ascii") for m in media]


def raw_prompt(prompt: str, media: Sequence[Media]) -> dict[str, Any]:
    """``/api/generate``'s ``prompt`` and ``images`` for a raw completion: the n-th marker becomes
    ``[img-n]``, the tag Ollama's runner splits a prompt at."""
    if not media:
        return {"prompt": prompt}
    parts = prompt.split(MEDIA_MARKER)
    text = parts[0] + "".join(f"[img-{i}]{rest}" for i, rest in enumerate(parts[1:]))
    return {"prompt": text, "images": _b64(media)}


def offered_tools(req: ChatRequest, capabilities: frozenset[str], *, model: str) -> list[dict[str, Any]]:
    """The tool definitions to send (none for ``tool_choice="none"``).

    Raises:
        UnsupportedFeature: the model has no tool support in Ollama, or ``tool_choice``
            asks for a call Ollama cannot force.
    """
    history = next((i for i, m in enumerate(req.messages) if m.tool_calls or m.role == "tool"), None)
    if (req.tools and req.tool_choice != "none" or history is not None) and "tools" not in capabilities:
        param = "tools" if req.tools else f"messages[{history}]"
        raise UnsupportedFeature(
            f"{param!r} is not supported by the ollama runtime serving {model}: "
            "Ollama does not list tool support for this model",
            param=param,
            hint="use a model Ollama lists with the 'tools' capability",
        )
    choice = req.tool_choice
    if choice not in (None, "auto", "none"):
        toolcalls.forced_call(req, toolcalls.HERMES)  # a choice naming an unknown function: its own 400
        raise UnsupportedFeature(
            f"tool_choice (or function_call) {choice!r} cannot be honoured: Ollama cannot force {model} to call a tool",
            param="tool_choice",
            hint="use tool_choice 'auto' (the model decides) or 'none'",
        )
    if not req.tools or choice == "none":
        return []
    return [dict(t) for t in req.tools]


def _arguments(arguments: Any, index: int, name: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or isinstance(arguments, str) and not arguments.strip():
        return {}
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise UnsupportedFeature(
            f"messages[{index}]: the arguments of the call to {name!r} are not a JSON object "
            f"({str(arguments)[:80]!r}); "
            "Ollama takes arguments as an object",
            param=f"messages[{index}]",
            hint="send the arguments the model produced, a JSON object encoded as a string",
        )
    return value


def ollama_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages in Ollama's shape: calls with object arguments, results with ``tool_name``."""
    called: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.media:
            d["content"] = m.content.replace(MEDIA_MARKER, "[img]")
            d["images"] = _b64(m.media)
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                fn = c.get("function") or {}
                name = fn.get("name")
                call: dict[str, Any] = {
                    "function": {"name": name, "arguments": _arguments(fn.get("arguments"), i, name)}
                }
                if c.get("id"):
                    call["id"] = c["id"]
                    called[str(c["id"])] = str(name)
                calls.append(call)
            d["tool_calls"] = calls
        if m.role == "tool":
            name = m.name or called.get(m.tool_call_id or "")
            if name:
                d["tool_name"] = name
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


# --- out of the answer -------------------------------------------------------------------


def _logprob(entry: dict[str, Any], *, top: bool) -> dict[str, Any]:
    token = str(entry.get("token", ""))
    raw = entry.get("bytes")
    out: dict[str, Any] = {
        "token": token,
        "logprob": float(entry.get("logprob", 0.0)),
        "bytes": list(raw) if raw is not None else list(token.encode()),
    }
    if top:
        out["top_logprobs"] = [_logprob(a, top=False) for a in entry.get("top_logprobs") or () if isinstance(a, dict)]
    return out


def logprob_entries(raw: Any) -> list[dict[str, Any]]:
    """Ollama's ``logprobs`` list in localrun's shape (``bytes`` filled in when Ollama leaves it out)."""
    return [_logprob(e, top=True) for e in raw or () if isinstance(e, dict)]


def _pieces(events: Generator[dict[str, Any], None, None], kind: str, seen: dict[str, bool]) -> Iterator[Piece]:
    """Ollama NDJSON objects as pieces; the ``done`` object carries the counts. ``seen``
    notes whether any text and any logprobs came (an old Ollama sends none)."""
    try:
        for event in events:
            message = event.get("message") or {}
            text = (message.get("content") if kind == "chat" else event.get("response")) or ""
            calls = tuple(openai_calls(message["tool_calls"])) if message.get("tool_calls") else ()
            logprobs = tuple(logprob_entries(event.get("logprobs")))
            seen["text"] = seen["text"] or bool(text)
            seen["logprobs"] = seen["logprobs"] or bool(logprobs)
            if event.get("done"):
                reason = "length" if event.get("done_reason") == "length" else "stop"
                usage = Usage(
                    prompt_tokens=int(event.get("prompt_eval_count") or 0),
                    completion_tokens=int(event.get("eval_count") or 0),
                )
                yield Piece(text, finish_reason=reason, usage=usage, tokens=0, logprobs=logprobs, tool_calls=calls)
                return
            yield Piece(text, logprobs=logprobs, tool_calls=calls)
    finally:
        events.close()


def shape_ollama_stream(
    events: Generator[dict[str, Any], None, None], kind: str, *, sampling: Sampling, cancel: Cancel, server: str
) -> Iterator[Chunk]:
    """Chunks for Ollama's NDJSON ``events`` (``kind``: "chat" or "generate")."""
    seen = {"text": False, "logprobs": False}
    chunks = shape_stream(_pieces(events, kind, seen), stops=sampling.stop, cancel=cancel)
    try:
        for chunk in chunks:
            if (
                chunk.finish_reason not in (None, "cancelled")
                and sampling.logprobs is not None
                and seen["text"]
                and not seen["logprobs"]
            ):
                raise UnsupportedFeature(
                    f"the Ollama server at {server} answered without log-probabilities: "
                    f"they need Ollama {_dotted(MIN_LOGPROBS)} or newer",
                    param="logprobs",
                    hint="upgrade Ollama, or leave out logprobs",
                )
            yield chunk
    finally:
        chunks.close()
