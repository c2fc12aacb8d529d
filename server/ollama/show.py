"""``/api/show``: what a model is and what it can do, in Ollama's shape.

Clients decide from ``capabilities`` what to offer: llm-ollama registers an embedding model
only for ``embedding`` and passes tools only for ``tools``; oterm greys out tools and thinking
without them. So they are read from the model itself, as Ollama reads them (its
``Model.Capabilities``): pooling makes an embedding model, the chat template's variables say
tools (and thinking, by its reasoning markers), fill-in-the-middle tokens say insert, a
projector says vision (and audio, by its header's ``clip.has_*_encoder`` keys, read without
loading the model; ``projector_info`` carries that header as Ollama's does). ``model_info``
carries the GGUF keys with their architecture prefix (``llama.context_length``,
``general.architecture``), which is what clients look up.
"""

from __future__ import annotations

from typing import Any

from localrun.chat.reasoning import detect_format
from localrun.chat.tools import template_uses_tools
from localrun.modelstore.projector import capabilities as media_capabilities
from localrun.modelstore.projector_facts import projector_facts
from localrun.server.model_info import details, digest, iso
from localrun.types import Format, ModelRecord

#: Keys ``localrun import`` / ``/api/create`` record (the same names planning/overrides.py reads).
META_POOLING = "localrun.pooling"
META_TEMPLATE = "localrun.chat_template"
META_SYSTEM = "localrun.system"
META_PARAMETERS = "localrun.parameters"
#: Encoder-only architectures: they embed, they cannot generate.
ENCODERS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "neo-bert", "modern-bert", "t5encoder"})
#: llama.cpp's pooling enum (``LLAMA_POOLING_TYPE_*``) as GGUF's ``ARCH.pooling_type`` stores it.
_POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
_FIM_KEYS = (
    ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id"),
    ("tokenizer.ggml.prefix_token_id", "tokenizer.ggml.suffix_token_id", "tokenizer.ggml.middle_token_id"),
)


def _scalars(record: ModelRecord) -> dict[str, Any]:
    scalars = (record.metadata or {}).get("scalars")
    return scalars if isinstance(scalars, dict) else {}


def native_pooling(record: ModelRecord) -> str | None:
    """The pooling the GGUF itself declares (an embedding or reranking model), or None."""
    arch = (record.metadata or {}).get("architecture")
    value = _scalars(record).get(f"{arch}.pooling_type") if arch else None
    return _POOLING_NAMES.get(value) if isinstance(value, int) else None


def pooling(record: ModelRecord, settings=None) -> str | None:
    """The pooling the model embeds with: config.toml's override, the import's, or the GGUF's."""
    chosen = (record.metadata or {}).get(META_POOLING) or native_pooling(record)
    configured = getattr(settings, "models", None) or {}
    for key in ("*", record.name):
        entry = configured.get(key)
        if entry is not None and entry.pooling is not None:
            chosen = entry.pooling
    return chosen


def chat_template(record: ModelRecord) -> str:
    meta = record.metadata or {}
    template = meta.get(META_TEMPLATE) or meta.get("chat_template")
    return template if isinstance(template, str) else ""


def capabilities(record: ModelRecord, settings=None) -> list[str]:
    """What the model can do, in Ollama's names and order."""
    if record.format is Format.REMOTE:  # an upstream's model: what its /v1/models entry says
        media = (record.metadata or {}).get("upstream_media") or ()
        return ["completion", *(c for c in ("vision", "audio") if c in media)]
    meta = record.metadata or {}
    scalars = _scalars(record)
    pool = pooling(record, settings)
    native = native_pooling(record)
    arch = str(meta.get("architecture") or "")
    out = []
    # A GGUF that declares its own pooling (or an encoder) is an embedding model, as Ollama
    # counts it; a generative model given a pooling override does both.
    if arch not in ENCODERS and native in (None, "none"):
        out.append("completion")
    if pool is not None and pool not in ("none", "rank"):
        out.append("embedding")
    media = media_capabilities(record)
    # A GGUF with its encoder inside (``ARCH.vision.block_count``, as Ollama's own converts have) sees too.
    if "vision" in media or scalars.get("clip.has_vision_encoder") or scalars.get(f"{arch}.vision.block_count"):
        out.append("vision")
    if "audio" in media or scalars.get(f"{arch}.audio.block_count"):
        out.append("audio")
    template = chat_template(record)
    if "completion" in out and template_uses_tools(template or None):
        out.append("tools")
    if any(all(isinstance(scalars.get(k), int) and scalars[k] >= 0 for k in keys) for keys in _FIM_KEYS):
        out.append("insert")
    if "completion" in out and detect_format(template or None) is not None:
        out.append("thinking")
    return out


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
    for key, value in _scalars(record).items():
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


def ollama_show(record: ModelRecord, loaded: dict | None, *, verbose: bool, settings=None) -> dict[str, Any]:
    meta = record.metadata or {}
    system = meta.get(META_SYSTEM) or ""
    params = meta.get(META_PARAMETERS) if isinstance(meta.get(META_PARAMETERS), dict) else {}
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
