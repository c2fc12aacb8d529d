"""The OpenAPI document at ``/openapi.json``, built from what each route declares.

Every route parses its body by hand (``await parse_body(request, Model)``, server/fields.py),
so FastAPI never sees the models and its own generator would document no request body at
all. Instead a route carries :func:`documented` — one decorator line above the function
naming its body model, its main success answer and how it streams — and :func:`build`
walks the app's real routes (the bare aliases, the mirror's plain Starlette routes and
all) and writes the document from those marks. tests/server/test_openapi.py holds the
marks to the truth: every route is in the document, and each declared body is the model
the route's own ``parse_body`` call names.

The document states the field policy of server/fields.py: unknown top-level fields are
accepted (and named in ``X-Localrun-Ignored-Fields``), so a body's top level allows
additional properties unless the route is strict (``documented(..., strict=True)``: the
admin routes) or the server runs with ``server.strict_fields``.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, JsonSchemaValue, models_json_schema
from starlette.responses import HTMLResponse, JSONResponse

from localrun.server.errors import ErrorShapes, shapes_of
from localrun.server.events import item_schema

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.applications import Starlette

    from localrun.settings import Settings

log = logging.getLogger(__name__)

#: The attribute :func:`documented` sets on an endpoint.
MARK = "__localrun_openapi__"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
REF = "#/components/schemas/{model}"
#: Routes of the framework itself, never documented: the document and its viewer.
FRAMEWORK_PATHS = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
#: Whose shapes the shared kit's colliding names are (server/schemas.py: OpenAI's chat message,
#: which llama-server's ``/apply-template`` takes too), so the names read ``OpenaiChatMessage``.
KIT_FAMILY = "openai"
#: The ``$ref`` of each declared (model, mode) pair, as pydantic's ``models_json_schema`` keys them.
Refs = dict[tuple[type[Any], JsonSchemaMode], JsonSchemaValue]
F = TypeVar("F", bound=Callable[..., Any])
_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::[A-Za-z_]+)?\}")


@dataclass(frozen=True)
class Doc:
    """What one endpoint declares: the body it parses, what it answers, how it streams."""

    body: type[BaseModel] | None = None
    answer: type[BaseModel] | None = None
    stream: str | None = None  # SSE or NDJSON: the media type of the streamed answer
    media: str | None = None  # a non-JSON answer (text/plain, application/octet-stream)
    strict: bool = False  # the top level refuses unknown fields whatever server.strict_fields says
    summary: str = ""
    tag: str = ""
    query: tuple[str, ...] = ()  # query parameters the route reads: "name" (optional) or "name=a|b" (required enum)
    upload: str | None = None  # a raw request body of this media type (a blob), answered 201 with none
    patterns: tuple[tuple[str, str], ...] = ()  # (path parameter, the regular expression it must match)


def documented(
    body: type[BaseModel] | None = None,
    answer: type[BaseModel] | None = None,
    *,
    stream: str | None = None,
    media: str | None = None,
    strict: bool = False,
    summary: str = "",
    tag: str = "",
    query: tuple[str, ...] = (),
    upload: str | None = None,
    patterns: tuple[tuple[str, str], ...] = (),
) -> Callable[[F], F]:
    """Mark a route function with its OpenAPI facts; the function itself is returned unchanged,
    so the decorator sits above or below ``@router.post(...)`` alike."""
    doc = Doc(body, answer, stream, media, strict, summary, tag, query, upload, patterns)

    def mark(fn: F) -> F:
        setattr(fn, MARK, doc)
        return fn

    return mark


def doc_of(endpoint: Callable[..., Any] | None) -> Doc | None:
    return getattr(endpoint, MARK, None) if endpoint is not None else None


@dataclass(frozen=True)
class Operation:
    """One (path, method) pair of the app, as the document lists it."""

    path: str  # OpenAPI form: ``{model}``, never ``{model:path}``
    method: str  # lower case
    endpoint: Callable[..., Any] | None
    doc: Doc | None


def operations(app: Starlette) -> list[Operation]:
    """Every (path, method) the app answers, in matching order, the framework's own routes left out.

    A route is in when its endpoint is marked, or when FastAPI itself would have documented it
    (``include_in_schema``); the bare aliases are hidden from FastAPI but carry their mark.
    """
    from fastapi.routing import iter_route_contexts

    found: list[Operation] = []
    seen: set[tuple[str, str]] = set()
    for ctx in iter_route_contexts(app.routes):
        path = getattr(ctx, "path", None)
        if not path or path in FRAMEWORK_PATHS:
            continue
        endpoint = getattr(ctx, "endpoint", None)
        doc = doc_of(endpoint)
        if doc is None and not getattr(ctx, "include_in_schema", True):
            continue
        for method in sorted(getattr(ctx, "methods", None) or ()):
            key = (openapi_path(path), method.lower())
            if key not in seen:  # an earlier route wins, as in matching
                seen.add(key)
                found.append(Operation(key[0], key[1], endpoint, doc))
    return found


def openapi_path(path: str) -> str:
    """Starlette's ``{rest:path}`` as OpenAPI's ``{rest}``."""
    return _PARAM.sub(r"{\1}", path)


def operation_id(method: str, path: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_") or "root"
    return f"{method}_{slug}"


def build(app: FastAPI, *, strict_fields: bool = False, title: str = "localrun", version: str = "") -> dict[str, Any]:
    """The whole OpenAPI 3.1 document of ``app``."""
    ops = operations(app)
    shapes = shapes_of(app)
    components, refs = _components(ops, shapes, strict_fields=strict_fields)
    paths: dict[str, dict[str, Any]] = {}
    ids: set[str] = set()
    for op in ops:
        oid = operation_id(op.method, op.path)
        n = 2
        while oid in ids:  # '/a-b' and '/a_b' slug alike: keep ids unique anyway
            oid, n = f"{operation_id(op.method, op.path)}_{n}", n + 1
        ids.add(oid)
        paths.setdefault(op.path, {})[op.method] = _operation(op, oid, refs, shapes)
    _link_created(paths)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": (
                "localrun's server: OpenAI, Ollama, Anthropic, Responses and llama-server APIs, its admin "
                "routes and (with --mirror) a Hugging Face hub mirror. Unknown top-level request fields are "
                "ignored and named in the X-Localrun-Ignored-Fields header (server.strict_fields makes them a 400)."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        "security": [{}, {"bearer": []}, {"apiKey": []}],
    }


def _link_created(paths: dict[str, dict[str, Any]]) -> None:
    """Links from what a POST creates to the item routes under it (``POST /v1/responses`` →
    ``GET``/``DELETE /v1/responses/{rid}``, with the answer's ``id``), so stateful testing can chain them."""
    for path, ops in paths.items():
        post = ops.get("post")
        if post is None or "application/json" not in post["responses"].get("200", {}).get("content", {}):
            continue
        for item, item_ops in paths.items():
            names = _PARAM.findall(item)
            if not item.startswith(path + "/") or len(names) != 1 or item != f"{path}/{{{names[0]}}}":
                continue
            links = post["responses"]["200"].setdefault("links", {})
            for method in ("get", "delete"):
                if method in item_ops:
                    links[f"{method.title()}Created"] = {
                        "operationId": item_ops[method]["operationId"],
                        "parameters": {names[0]: "$response.body#/id"},
                    }


def _components(ops: list[Operation], shapes: ErrorShapes, *, strict_fields: bool) -> tuple[dict[str, Any], Refs]:
    """The schemas of every declared model, and the ``$ref`` of each (model, mode) pair.

    Pydantic names the components (a longer name only where two models share one).
    """
    bodies = {op.doc.body for op in ops if op.doc and op.doc.body}
    answers = {op.doc.answer for op in ops if op.doc and op.doc.answer} | {
        shapes.shape_for(op.path).model for op in ops
    }
    pairs: list[tuple[type[BaseModel], JsonSchemaMode]] = [(m, "validation") for m in sorted(bodies, key=_key)]
    pairs += [(m, "serialization") for m in sorted(answers, key=_key)]
    if not pairs:
        return {}, {}
    refs, top = models_json_schema(pairs, ref_template=REF)
    schemas = top.get("$defs", {})
    if not strict_fields:
        for op in ops:
            if op.doc and op.doc.body and not op.doc.strict:
                # The top level ignores unknown names (server/fields.py); nested levels stay strict.
                name = refs[(op.doc.body, "validation")]["$ref"].rsplit("/", 1)[-1]
                schemas[name] = {k: v for k, v in schemas[name].items() if k != "additionalProperties"}
    return _short_names(schemas, refs)


def _short_names(schemas: dict[str, Any], refs: Refs) -> tuple[dict[str, Any], Refs]:
    """Pydantic spells a shared name with its whole module path (``localrun__server__ollama__schemas__ChatMessage``);
    the family and the name (``OllamaChatMessage``) read better in a generated client."""
    renames: dict[str, str] = {}
    for name in schemas:
        parts = name.split("__")
        if len(parts) >= 3:
            family = KIT_FAMILY if parts[-3] == "server" else parts[-3]
            short = family.title().replace("_", "") + parts[-1]
            if short not in schemas and short not in renames.values():
                renames[name] = short
    if not renames:
        return schemas, refs
    text = json.dumps({"schemas": schemas, "refs": list(refs.values())})
    for old, new in renames.items():
        text = text.replace(f'"{REF.format(model=old)}"', f'"{REF.format(model=new)}"')
    done = json.loads(text)
    renamed = {renames.get(k, k): v for k, v in done["schemas"].items()}
    return renamed, dict(zip(refs, done["refs"], strict=True))


def _key(model: type) -> str:
    return f"{model.__module__}.{model.__qualname__}"


def _operation(op: Operation, oid: str, refs: Refs, shapes: ErrorShapes) -> dict[str, Any]:
    doc = op.doc or Doc()
    out: dict[str, Any] = {"operationId": oid, "tags": [doc.tag or _tag(op.path)]}
    if doc.summary or op.endpoint is not None:
        out["summary"] = doc.summary or _first_line(op.endpoint)
    pattern = dict(doc.patterns)
    params = [
        {"name": name, "in": "path", "required": True, "schema": _path_schema(pattern.get(name))}
        for name in _PARAM.findall(op.path)
    ]
    params += [_query(q) for q in doc.query]
    if params:
        out["parameters"] = params
    if doc.body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": dict(refs[(doc.body, "validation")])}},
        }
    if doc.upload is not None:
        binary = {"type": "string", "format": "binary"}
        out["requestBody"] = {"required": True, "content": {doc.upload: {"schema": binary}}}
    if op.method == "head":  # the headers of the GET, no body
        out["responses"] = {"200": {"description": "success (headers only)"}, "default": {"description": "an error"}}
        return out
    error = {
        "description": "an error, in the API family's shape",
        "content": {"application/json": {"schema": dict(refs[(shapes.shape_for(op.path).model, "serialization")])}},
    }
    if doc.upload is not None:
        out["responses"] = {"201": {"description": "stored, with no body"}, "default": error}
        return out
    out["responses"] = {"200": _success(doc, refs, op.path), "default": error}
    return out


def _path_schema(pattern: str | None) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, **({"pattern": pattern} if pattern else {})}


def _query(spec: str) -> dict[str, Any]:
    """A query parameter: ``"name"`` (an optional string) or ``"name=a|b|c"`` (required, one of those)."""
    name, sep, choices = spec.partition("=")
    if not sep:
        return {"name": name, "in": "query", "required": False, "schema": {"type": "string"}}
    return {"name": name, "in": "query", "required": True, "schema": {"type": "string", "enum": choices.split("|")}}


def _success(doc: Doc, refs: Refs, path: str = "") -> dict[str, Any]:
    content: dict[str, Any] = {}
    if doc.answer is not None:
        content["application/json"] = {"schema": dict(refs[(doc.answer, "serialization")])}
    if doc.stream == SSE:  # each event's shape (OpenAPI 3.2's itemSchema; server/events.py)
        content[doc.stream] = {"itemSchema": item_schema(path)}
    elif doc.stream:
        content[doc.stream] = {"schema": {"type": "string"}}
    if doc.media:
        content[doc.media] = {"schema": {"type": "string"}}
    answer: dict[str, Any] = {
        "description": "success" + (" (streamed when asked)" if doc.stream and doc.answer else "")
    }
    if content:
        answer["content"] = content
    else:
        answer["description"] = "success, with no body"
    return answer


def _tag(path: str) -> str:
    if path.startswith("/api/models") or "/resolve/" in path:
        return "mirror"
    if path.startswith("/api/"):
        return "ollama"
    if path.startswith("/admin") or path in ("/health", "/metrics"):
        return "admin"
    if path.startswith("/v1/messages"):
        return "anthropic"
    if "responses" in path:
        return "responses"
    return "openai"


def _first_line(fn: Callable[..., Any] | None) -> str:
    text = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    return text[0] if text else getattr(fn, "__name__", "").replace("_", " ")


def _bound_choices(doc: dict[str, Any], most: int) -> None:
    """``n`` and ``best_of`` say the server's own limit (``server.max_choices``), not the model field's
    widest: the routes refuse more (a 400), so a client generator reading 128 would be told wrong."""
    for schema in doc.get("components", {}).get("schemas", {}).values():
        for name in ("n", "best_of"):
            for branch in _branches((schema.get("properties") or {}).get(name)):
                if isinstance(branch.get("maximum"), int):
                    branch["maximum"] = min(branch["maximum"], most)


def _branches(prop: Any) -> list[dict[str, Any]]:
    if not isinstance(prop, dict):
        return []
    return [prop, *(b for b in prop.get("anyOf", ()) if isinstance(b, dict))]


def install(app: FastAPI, settings: Settings) -> None:
    """Serve the document (and, with ``server.docs``, the Swagger UI at ``/docs``).

    The routes sit behind the same middleware as the rest, so with an API key set the
    document needs the key too. It is built once, on first request, when every route exists.
    """
    cache: dict[str, Any] = {}

    def document() -> dict[str, Any]:
        if "doc" not in cache:
            cache["doc"] = build(app, strict_fields=settings.server.strict_fields, version=app.version)
            _bound_choices(cache["doc"], settings.server.max_choices)
        return copy.deepcopy(cache["doc"])

    # FastAPI's own docs page reads it here; replacing the method is FastAPI's documented way, its types say no
    app.openapi = document  # type: ignore[method-assign]

    async def openapi_json() -> JSONResponse:
        return JSONResponse(document())

    app.add_api_route("/openapi.json", openapi_json, methods=["GET"], include_in_schema=False)
    if settings.server.docs:
        from fastapi.openapi.docs import get_swagger_ui_html

        async def swagger() -> HTMLResponse:
            return get_swagger_ui_html(openapi_url="/openapi.json", title="localrun API")

        app.add_api_route("/docs", swagger, methods=["GET"], include_in_schema=False)
