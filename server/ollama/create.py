"""``/api/copy`` and ``/api/create``: new registrations of models the store already has.

Both write a real record to the store (the one door, ``ModelStore.register``), so the new name
is listed, shown, loaded, copied and deleted like any other; its files are the source's, never
copied, and stay until no registration uses them.

``/api/create`` takes Ollama's current body (docs/api.md): a model ``from`` an existing one, or
from ``files`` given by sha256, plus the layers that change behaviour: ``system``, ``template``,
``parameters``, ``license``. What localrun cannot do is a 400 that says so: ``quantize``,
``adapters``, ``messages``, Ollama's renderers and parsers, a Go template, and files it does not
have. ``files`` names blobs by sha256: a registered model's files (a file imported without a
recorded sha256 is hashed once to find it) or uploads (blobs.py, ``POST /api/blobs``); no HTTP
route takes a path on the server's disk (shared/security.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import JSONResponse, Response

from localrun.errors import ModelExists, ModelNotFound, TemplateError
from localrun.modelstore.capabilities import META_TEMPLATE
from localrun.modelstore.identity import without_latest
from localrun.modelstore.names import validate_model_name
from localrun.server.errors import InvalidRequest
from localrun.server.fields import parse_body, validation_error
from localrun.server.generation import app_state
from localrun.server.ollama import answers
from localrun.server.ollama.schemas import CopyBody, CreateBody, Options
from localrun.server.ollama.show import META_PARAMETERS, META_SYSTEM
from localrun.server.openapi import NDJSON, documented
from localrun.types import Format, ModelRecord

if TYPE_CHECKING:
    from localrun.manager import ModelManager

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api")

META_LICENSE = "localrun.license"


def store_name(name: str) -> str:
    """The store's name for a name a client gives: ``NAME:latest`` is ``NAME`` (see identity.tagged)."""
    return validate_model_name(without_latest(name) or name)


def _local(manager: ModelManager, name: str) -> ModelRecord:
    """A model in the store (an upstream's model has no files here to register again)."""
    record = manager.resolve(name)
    if record.format is Format.REMOTE:
        raise InvalidRequest(
            f"{record.name} is served by an upstream; only models in this store can be copied or built on",
            hint="pull or import the model here first",
        )
    return record


def _register(manager: ModelManager, record: ModelRecord) -> ModelRecord:
    """Write ``record`` under its name. A name that holds the same files is replaced, as Ollama's
    copy and create replace a manifest (creating ``mario`` again with a new system prompt); a name
    that holds other files is refused, since replacing it would orphan files localrun may own. A
    model loaded under that name is unloaded first, so the next request loads the new one."""
    existing = manager.store.index.find(record.name)
    if existing is not None and [f.path for f in existing.files] != [f.path for f in record.files]:
        raise ModelExists(
            f"the name {record.name} is taken by another model ({existing.path})",
            hint=f"delete it first (DELETE /api/delete, or `localrun rm {record.name}`), or choose another name",
        )
    manager.unload(record.name)
    registered: ModelRecord = manager.store.register(record, replace=True)
    return registered


@documented(CopyBody)
@router.post("/copy")
async def copy(request: Request) -> Response:
    body: CopyBody = await parse_body(request, CopyBody)
    manager = app_state(request).manager
    source = await asyncio.to_thread(_local, manager, body.source)
    destination = store_name(body.destination)
    if destination != source.name:
        copied = dataclasses.replace(source, name=destination, added_at=time.time())
        await asyncio.to_thread(_register, manager, copied)
        log.info("copied %s to %s", source.name, destination)
    return Response(status_code=200)


def _refuse_unsupported(body: CreateBody) -> None:
    if body.modelfile is not None or body.path is not None:
        raise InvalidRequest(
            "the Modelfile body ('modelfile', 'path') is Ollama's old API",
            hint="send 'from' (or 'files') with 'system', 'template' and 'parameters' as fields",
            param="modelfile" if body.modelfile is not None else "path",
        )
    for field, why in (
        ("quantize", "localrun does not quantize models: pull or import a quantized GGUF"),
        ("adapters", "LoRA adapters are not supported"),
        ("messages", "a stored conversation is not supported: send the messages with each request"),
        ("renderer", "Ollama's built-in renderers are not part of localrun: send a Jinja 'template'"),
        ("parser", "Ollama's built-in parsers are not part of localrun"),
    ):
        if getattr(body, field):
            raise InvalidRequest(f"{field!r} is not supported by /api/create: {why}", param=field)
    if body.from_ and body.files:
        raise InvalidRequest("give 'from' or 'files', not both", param="files")
    if not body.from_ and not body.files:
        raise InvalidRequest("missing 'from' (an existing model) or 'files' (sha256 digests)", param="from")


def _by_digest(manager: ModelManager, files: dict[str, str], name: str) -> ModelRecord:
    """The store's model whose files are exactly these digests (each file once, any names), else a
    new model made of the blobs with those digests (uploads, or registered files found by sha256)."""
    from localrun.modelstore.blobs import BlobStore, parse_digest

    wanted = [parse_digest(ref) for ref in files.values()]
    blobs = BlobStore(manager.store)
    for _ in range(2):  # the second look after learning the sha256 of files imported without one
        records: list[ModelRecord] = list(manager.store.list())
        for record in records:
            if {(f.sha256 or "").lower() for f in record.files} == set(wanted):
                return record
        if not blobs.learn_unknown():
            break
    try:
        return blobs.record_of(wanted, name)
    except ModelNotFound as exc:  # a digest the server has not got: the request's fault, as in Ollama
        raise InvalidRequest(f"files: {exc.message}", hint=exc.hint, param="files") from None


def _checked_template(template: str) -> str:
    from localrun.chat.template import try_render

    try:
        try_render(template)
    except TemplateError as exc:
        raise InvalidRequest(
            f"the template does not render as a Jinja chat template: {exc.message}",
            hint="localrun speaks the GGUF's Jinja templates; Ollama's Go templates ({{ .Prompt }}) are not supported",
            param="template",
        ) from None
    return template


def _checked_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """Ollama's parameters are its options: typed and bounded by the same schema; unknown names refused
    here (a stored typo would be ignored on every request)."""
    try:
        options = Options.model_validate(params)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if options.model_extra:
        name = next(iter(options.model_extra))
        raise InvalidRequest(f"unknown parameter {name!r}", param=f"parameters.{name}")
    return options.model_dump(exclude_unset=True)


def _created(manager: ModelManager, body: CreateBody, name: str) -> ModelRecord:
    base = _local(manager, body.from_) if body.from_ else _by_digest(manager, body.files or {}, name)
    meta = dict(base.metadata or {})
    if body.system is not None:
        meta[META_SYSTEM] = body.system
    if body.template is not None:
        meta[META_TEMPLATE] = _checked_template(body.template)
    if body.parameters:
        meta[META_PARAMETERS] = {**(meta.get(META_PARAMETERS) or {}), **_checked_parameters(body.parameters)}
    if body.license is not None:
        meta[META_LICENSE] = body.license
    record = dataclasses.replace(base, name=name, metadata=meta, added_at=time.time())
    return _register(manager, record)


@documented(CreateBody, answers.OllamaStatus, stream=NDJSON)
@router.post("/create")
async def create(request: Request) -> Response:
    body: CreateBody = await parse_body(request, CreateBody)
    if not (body.model or body.name):
        raise InvalidRequest("missing required field 'model'", param="model")
    _refuse_unsupported(body)
    name = store_name(body.model or body.name or "")
    manager = app_state(request).manager
    record = await asyncio.to_thread(_created, manager, body, name)
    log.info("created %s from %s", record.name, body.from_ or "files")
    if body.stream is False:
        return JSONResponse({"status": "success"})
    lines = b'{"status":"reading model metadata"}\n{"status":"writing manifest"}\n{"status":"success"}\n'
    return Response(lines, media_type="application/x-ndjson")
