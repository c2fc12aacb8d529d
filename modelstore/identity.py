"""What identifies a registration on the wire: its digest, and Ollama's ``:latest`` tag.

Ollama's ``/api/tags`` gives each model the sha256 of its manifest, so two names of one
manifest share a digest and anything that changes the model's behaviour (a system prompt, a
template, parameters) makes a new one. Clients lean on that: llm-ollama groups names by
digest and caches capabilities under it, so one digest for every model (the empty string)
made three models one. :func:`registration_digest` is localrun's equivalent: the files'
content plus every override recorded with the registration.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from localrun.types import ModelRecord

from .verify import file_path

#: Metadata keys under this prefix are what a registration adds to its files (pooling, chat
#: template, system prompt, parameters, projector…): each changes what the model does.
OVERRIDE_PREFIX = "localrun."
LATEST = ":latest"


def registration_digest(record: ModelRecord, extra: dict[str, Any] | None = None) -> str:
    """A sha256 hex digest (64 characters) of the files plus what changes their behaviour.

    A file's recorded sha256 stands for its content where the store knows it (pulls, verified
    imports); a file not hashed yet (imports hash lazily) stands by its real path and size, so the
    digest is stable without reading gigabytes, and moves to the content once ``localrun verify``
    has recorded it. ``extra`` adds overrides that live outside the record (config.toml's
    ``[models."NAME"]``).
    """
    files: list[list[Any]] = []
    for entry in record.files:
        if entry.sha256:
            files.append(["sha256", entry.sha256.lower()])
        else:
            files.append(["file", os.path.realpath(file_path(record, entry.path)), entry.size])
    if not files:  # an upstream's model: its name and where it is served say what it is
        files.append(["remote", record.name, record.path, record.metadata.get("upstreams")])
    overrides = {k: v for k, v in (record.metadata or {}).items() if k.startswith(OVERRIDE_PREFIX)}
    overrides.update({k: v for k, v in (extra or {}).items() if v is not None})
    doc = {"format": record.format.value, "files": files, "overrides": overrides}
    text = json.dumps(doc, sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def has_tag(name: str) -> bool:
    """Whether ``name`` carries a ``:tag`` (the namespace never holds a colon)."""
    return ":" in name.rsplit("/", 1)[-1]


def tagged(name: str) -> str:
    """``name`` as Ollama lists it: ``NAME:latest`` when it has no tag of its own."""
    return name if has_tag(name) else name + LATEST


def without_latest(name: str) -> str | None:
    """``NAME`` for ``NAME:latest`` (any case), None for any other name: Ollama's clients send back
    the ``:latest`` name they were listed, and a bare registration is that model."""
    if len(name) > len(LATEST) and name[-len(LATEST) :].lower() == LATEST:
        return name[: -len(LATEST)]
    return None


def other_latest(name: str) -> str:
    """The other spelling of the same Ollama name: ``NAME`` for ``NAME:latest``, ``NAME:latest`` for an
    untagged ``NAME`` (a model imported as ``foo:latest`` is what a client asking for ``foo`` means)."""
    bare = without_latest(name)
    if bare is not None:
        return bare
    return name if has_tag(name) else name + LATEST
