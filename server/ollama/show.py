"""``/api/show``: what a model is and what it can do, in Ollama's shape.

``capabilities`` are :func:`localrun.modelstore.capabilities.capabilities`, the answer every
front end gives; ``projector_info`` carries the projector's header as Ollama's does. ``model_info``
carries the GGUF keys with their architecture prefix (``llama.context_length``,
``general.architecture``), which is what clients look up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localrun.modelstore.capabilities import capabilities, chat_template, scalars
from localrun.modelstore.projector_facts import projector_facts
from localrun.server.ollama.tags import details, digest, iso
from localrun.types import ModelRecord

if TYPE_CHECKING:
    from localrun.settings import Settings

#: Keys ``localrun import`` / ``/api/create`` record beside the pooling and template ones.
META_SYSTEM = "localrun.system"
META_PARAMETERS = "localrun.parameters"


def model_info(record: ModelRecord, *, verbose: bool) -> dict[str, Any]:
    """GGUF keys as Ollama's ``model_info`` has them (``general.*``, ``ARCH.*``, ``tokenizer.*``),
    with localrun's own flat names beside them (``context_length``…) for its older clients."""
    meta = dict(record.metadata or {})
    meta.pop("chat_template", None)
    info: dict[str, Any] = {
        k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool)) and not k.startswith("localrun.")
    }
    general = {
        "general.architecture": meta.get("architecture"),
        "general.name": meta.get("name"),
        "general.file_type": meta.get("file_type"),
        "general.parameter_count": meta.get("n_params") or None,
    }
    info.update({k: v for k, v in general.items() if v is not None})
    for key, value in scalars(record).items():
        if isinstance(value, (str, int, float, bool)) and (verbose or not isinstance(value, str) or len(value) <= 256):
            info[key] = value
    return info


def projector_info(record: ModelRecord, *, verbose: bool) -> dict[str, Any] | None:
    """The projector's header keys, as Ollama's ``projector_info`` (long strings only when verbose)."""
    facts = projector_facts(record)
    if facts is None:
        return None
    info = {
        k: v
        for k, v in facts.keys.items()
        if isinstance(v, (str, int, float, bool)) and (verbose or not isinstance(v, str) or len(v) <= 256)
    }
    info["general.parameter_count"] = facts.n_params
    return info


def parameters_text(params: dict[str, Any]) -> str:
    """Ollama's ``parameters``: one ``name value`` line each, a list as one line per item."""
    lines = []
    for key, value in sorted(params.items()):
        for item in value if isinstance(value, list) else [value]:
            shown = f'"{item}"' if isinstance(item, str) else str(item).lower() if isinstance(item, bool) else item
            lines.append(f"{key:<24} {shown}")
    return "\n".join(lines)


def ollama_show(
    record: ModelRecord, loaded: dict[str, Any] | None, *, verbose: bool, settings: Settings | None = None
) -> dict[str, Any]:
    meta = record.metadata or {}
    system = meta.get(META_SYSTEM) or ""
    found = meta.get(META_PARAMETERS)
    params: dict[str, Any] = found if isinstance(found, dict) else {}
    modelfile = f"# localrun model {record.name}\nFROM {record.path}\n"
    if system:
        modelfile += f'SYSTEM """{system}"""\n'
    modelfile += "".join(f"PARAMETER {line}\n" for line in parameters_text(params).splitlines())
    shown = {
        "modelfile": modelfile,
        "parameters": parameters_text(params),
        "template": chat_template(record),
        "details": details(record),
        "model_info": model_info(record, verbose=verbose),
        "capabilities": capabilities(record, settings),
        "modified_at": iso(record.added_at or None),
        "digest": digest(record, settings),
        "localrun": {"source": record.source.value, "path": record.path, "loaded": loaded},
    }
    if system:
        shown["system"] = system
    projector = projector_info(record, verbose=verbose)
    if projector is not None:
        shown["projector_info"] = projector
    return shown
