"""The field policy of every request body, in one place for every wire family (OpenAI, Ollama,
Anthropic, Responses, llama-server's) and localrun's admin routes.

Three kinds of top-level field:

* **known and honoured** — declared in the route's schema, typed and bounded;
* **known, not honourable here** — declared, paired by the schema's ``unsupported()`` with
  the capability it needs; when the loaded runtime lacks it the answer is a 400 naming the
  field and the runtime (:func:`refuse_unsupported`), never a silent ignore;
* **unknown** — accepted and ignored, as llama-server, vLLM and Ollama do (clients rely on
  it: llama.cpp's send ``id_slot``, ``timings_per_token``…), but never silently: the names
  go back in the ``X-Localrun-Ignored-Fields`` response header (:class:`IgnoredFieldsHeader`;
  percent-encoded where a name is not a header token, and counted in
  ``X-Localrun-Ignored-Fields-Unlisted`` where it cannot be shown) and to the log.
  ``server.strict_fields = true`` makes them a 400 again (OpenAI's rule).

Only the top level is lenient: nested objects (messages, tools, formats) stay strict, since
a typo there changes what the model sees.

A route uses it as ``body = await parse_body(request, Schema)``.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localrun.errors import UnsupportedFeature
from localrun.server.body_json import parse_checked, read_body
from localrun.server.errors import InvalidRequest

log = logging.getLogger(__name__)

HEADER = "X-Localrun-Ignored-Fields"
SCOPE_KEY = "localrun.ignored_fields"
#: How many ignored names the header lists (a hostile body may carry thousands).
MAX_LISTED = 32

#: What to do about a field whose capability the runtime lacks, where "remove the field" is wrong.
HINTS = {
    "token_prompts": "send the prompt (or input) as text, or load the model on llama.cpp",
    "fill-in-the-middle": (
        "this model has no fill-in-the-middle tokens: use a code model with FIM tokens, or leave the suffix out"
    ),
    "rerank": "use a reranker model (rank pooling), or load one with --pooling rank",
    "embeddings": "use an embedding model, or load this one with a pooling override (--pooling mean)",
    "vision": (
        "{model} has no vision projector: pair one with `localrun import MODEL.gguf --mmproj FILE`, "
        "or pull a repo that has one (an mmproj*.gguf beside the model)"
    ),
    "audio": (
        "{model} has no projector that takes audio: pair one with `localrun import MODEL.gguf --mmproj FILE`, "
        "or pull a repo whose projector takes audio"
    ),
    "audio_output": "localrun answers in text: leave 'audio' and 'modalities' out",
    "documents": "send the document's text as a text block; document (PDF) blocks are not read",
}
#: The audio hint when the model sees images but its projector takes no audio.
VISION_ONLY_HINT = "{model}'s projector takes images only: send images, or use a model whose projector takes audio"
#: What a media item is, for the refusal's sentence.
_MEDIA_WORDS = {"vision": "an image", "audio": "an audio clip"}


def known_fields(schema: type[BaseModel]) -> frozenset[str]:
    """Every top-level name ``schema`` accepts: field names and their aliases."""
    names = set()
    for name, info in schema.model_fields.items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
    return frozenset(names)


def strict_fields(request: Request) -> bool:
    settings = getattr(request.app.state, "settings", None)
    return bool(getattr(getattr(settings, "server", None), "strict_fields", False))


async def parse_body(request: Request, schema: type[BaseModel], *, lenient: bool = True) -> Any:
    """The body validated against ``schema`` under the field policy; any problem is one 400 naming the field.

    ``lenient=False`` keeps unknown fields a 400 whatever the setting: localrun's own admin
    routes, which only its TUI calls and where an ignored field would be a surprise.
    """
    raw = await read_body(request)
    data = await parse_checked(raw)  # a large one off the loop, in short C calls: see server.body_json
    if isinstance(data, dict) and lenient:
        data = drop_unknown(request, data, schema)
    try:
        # Strict: JSON types as the APIs' specs and the OpenAPI document state them (false is not
        # 0, 0 is not false, "0.5" is not a number); an integer still passes as a number.
        return schema.model_validate(data, strict=True)
    except ValidationError as exc:
        raise validation_error(exc) from None


def validation_error(exc: ValidationError) -> InvalidRequest:
    first = exc.errors(include_url=False, include_input=False)[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if not _is_union_tag(p))
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        msg = f"unknown field {loc!r}"
    elif kind == "missing":
        msg = f"missing required field {loc!r}"
    elif kind in ("json_invalid", "json_type"):
        msg = f"the body is not valid JSON: {first.get('msg', '')}"
    elif not loc:
        msg = f"the body must be a JSON object: {first.get('msg', '')}"
    else:
        msg = f"invalid value for {loc!r}: {first.get('msg', '')}"
    more = exc.error_count() - 1
    if more > 0:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return InvalidRequest(msg, param=loc or None)


def _is_union_tag(part: Any) -> bool:
    """Pydantic puts a union member's type in the location ('str', 'list[str]', 'Loose'): not a field.

    Field names here are snake_case, so a capitalised, bracketed or hyphenated part is a tag.
    """
    if not isinstance(part, str):
        return False
    return part in ("str", "int", "float", "bool", "list", "dict") or part[:1].isupper() or "[" in part or "-" in part


def drop_unknown(request: Request, data: dict[str, Any], schema: type[BaseModel]) -> dict[str, Any]:
    """``data`` without the top-level names ``schema`` does not know; they are noted for the
    header and the log, or a 400 in strict mode."""
    known = known_fields(schema)
    unknown = [k for k in data if k not in known]
    if not unknown:
        return data
    if strict_fields(request):
        raise InvalidRequest(
            f"unknown field {unknown[0]!r}",
            param=unknown[0],
            hint="remove it (the server runs with server.strict_fields = true)",
        )
    note_ignored(request, unknown)
    return {k: v for k, v in data.items() if k in known}


#: What an ignored name may show as itself in the header: RFC 9110 token characters, less "%",
#: which starts an escape. Everything else is percent-encoded as UTF-8, so a name that starts or
#: ends with a space, holds a comma, a control character or non-ASCII text never makes the header
#: illegal (a space at either end once did: the server dropped the connection without answering).
_SHOWN_AS_IS = frozenset("!#$&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
#: Longest name shown (in characters, before encoding); a longer one is cut and marked with "...".
MAX_NAME_CHARS = 64
#: Counts the ignored names the header does not list (empty, not UTF-8, or past MAX_LISTED).
UNLISTED_HEADER = "X-Localrun-Ignored-Fields-Unlisted"
UNLISTED_KEY = "localrun.ignored_fields_unlisted"


def shown_name(name: str) -> str | None:
    """``name`` as a header token (percent-encoded where it is not a token character); None for a
    name that cannot be shown: the empty name, or one holding a lone surrogate (not UTF-8)."""
    if not name:
        return None
    cut = name[:MAX_NAME_CHARS]
    try:
        raw = cut.encode("utf-8")
    except UnicodeEncodeError:
        return None
    text = "".join(chr(b) if chr(b) in _SHOWN_AS_IS else f"%{b:02X}" for b in raw)
    return text + ("..." if len(name) > MAX_NAME_CHARS else "")


def note_ignored(request: Request, names: list[str]) -> None:
    """Keep the ignored names for the response header (shown safely, at most MAX_LISTED, the rest
    counted) and say them in the log."""
    listed = request.scope.setdefault(SCOPE_KEY, [])
    unlisted = 0
    for name in names:
        shown = shown_name(name)
        if shown is None or len(listed) >= MAX_LISTED:
            unlisted += 1
        elif shown not in listed:
            listed.append(shown)
    if unlisted:
        request.scope[UNLISTED_KEY] = request.scope.get(UNLISTED_KEY, 0) + unlisted
    log.info(
        "%s %s: ignored unknown field%s %s",
        request.method,
        request.url.path[:200],
        "s" if len(names) > 1 else "",
        ", ".join(listed) + (f" (+{unlisted} not listed)" if unlisted else ""),
    )


#: Sampling fields that, when set, need the capability of the same name.
SAMPLING_CAPABILITIES = ("frequency_penalty", "presence_penalty", "logit_bias", "grammar", "ignore_eos", "min_tokens")


def sampling_unsupported(req: BaseModel) -> list[tuple[str, str]]:
    """(field, capability) for the sampling extensions ``req`` sets (any schema that has them)."""
    found = [(name, name) for name in SAMPLING_CAPABILITIES if getattr(req, name, None)]
    typical = getattr(req, "typical_p", None)
    if typical is not None and typical < 1:
        found.append(("typical_p", "typical_p"))
    if getattr(req, "json_schema", None) is not None:
        found.append(("json_schema", "json_schema"))
    return found


def refuse_unsupported(found: list[tuple[str, str]], *, model: str, runtime: str, capabilities: frozenset[str]) -> None:
    """A 400 naming the first field whose capability the runtime does not declare.

    ``found`` pairs each field the request set with the capability it needs.
    """
    for field, capability in found:
        if capability not in capabilities:
            hint = HINTS.get(capability, "remove the field from the request")
            if capability == "audio" and "vision" in capabilities:
                hint = VISION_ONLY_HINT
            what = _MEDIA_WORDS.get(capability)
            raise UnsupportedFeature(
                f"{field!r} is {what}, which the {runtime} runtime serving {model} does not take"
                if what
                else f"{field!r} is not supported by the {runtime} runtime serving {model}",
                hint=hint.replace("{model}", model),
                param=field,
            )


class IgnoredFieldsHeader:
    """Adds ``X-Localrun-Ignored-Fields`` (the names, comma-separated, each a token) and, when
    some could not be listed, ``X-Localrun-Ignored-Fields-Unlisted`` (how many) to a response
    whose request had unknown fields."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                added = ignored_field_headers(scope)
                if added:
                    message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, sending)


def ignored_field_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The header lines for what :func:`note_ignored` kept; ASCII tokens only, never empty."""
    out = []
    names = scope.get(SCOPE_KEY)
    if names:
        out.append((HEADER.lower().encode(), ", ".join(names).encode("ascii")))
    unlisted = scope.get(UNLISTED_KEY)
    if unlisted:
        out.append((UNLISTED_HEADER.lower().encode(), str(unlisted).encode("ascii")))
    return out
