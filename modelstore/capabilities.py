"""What a model can do, read from the model itself: the one answer every front end gives.

``localrun ls``, the TUI's library, ``/v1/models`` and ``/api/show`` all ask :func:`capabilities`
(the manager's catalog carries it on each entry), so none of them shows less than another.
The names and their order are Ollama's (its ``Model.Capabilities``), which its clients decide
from: llm-ollama registers an embedding model only for ``embedding`` and passes tools only for
``tools``; oterm greys out tools and thinking without them.

* ``completion``: anything but an encoder or a model whose GGUF declares its own pooling;
* ``embedding``: a pooling (config.toml's override, the import's, or the GGUF's own);
* ``vision`` / ``audio``: the projector's header (:func:`media`), or an encoder inside the GGUF;
* ``tools``: the chat template reads a ``tools`` variable;
* ``insert``: the vocabulary has fill-in-the-middle tokens;
* ``thinking``: the chat template writes reasoning markers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from localrun.chat.reasoning import detect_format
from localrun.chat.tools import template_uses_tools
from localrun.errors import InvalidModelFile
from localrun.modelstore.projector import PROJECTOR_INFO, projector_path, read_projector
from localrun.types import AUDIO, VISION, Format, ModelRecord

if TYPE_CHECKING:
    from localrun.settings import Settings

logger = logging.getLogger(__name__)

#: Keys ``localrun import`` / ``/api/create`` record (the same names planning/overrides.py reads).
META_POOLING = "localrun.pooling"
META_TEMPLATE = "localrun.chat_template"
#: Encoder-only architectures: they embed, they cannot generate.
ENCODERS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "neo-bert", "modern-bert", "t5encoder"})
#: llama.cpp's pooling enum (``LLAMA_POOLING_TYPE_*``) as GGUF's ``ARCH.pooling_type`` stores it.
_POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
_FIM_KEYS = (
    ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id"),
    ("tokenizer.ggml.prefix_token_id", "tokenizer.ggml.suffix_token_id", "tokenizer.ggml.middle_token_id"),
)


def scalars(record: ModelRecord) -> dict[str, Any]:
    """The GGUF header's scalar keys the store cached (``ARCH.*``, ``tokenizer.*``, ``clip.*``)."""
    found = (record.metadata or {}).get("scalars")
    return found if isinstance(found, dict) else {}


def native_pooling(record: ModelRecord) -> str | None:
    """The pooling the GGUF itself declares (an embedding or reranking model), or None."""
    arch = (record.metadata or {}).get("architecture")
    value = scalars(record).get(f"{arch}.pooling_type") if arch else None
    return _POOLING_NAMES.get(value) if isinstance(value, int) else None


def pooling(record: ModelRecord, settings: Settings | None = None) -> str | None:
    """The pooling the model embeds with: config.toml's override, the import's, or the GGUF's."""
    chosen = (record.metadata or {}).get(META_POOLING) or native_pooling(record)
    configured = getattr(settings, "models", None) or {}
    for key in ("*", record.name):
        entry = configured.get(key)
        if entry is not None and entry.pooling is not None:
            chosen = entry.pooling
    return chosen


def chat_template(record: ModelRecord) -> str:
    """The template the model chats with: the import's override, else the GGUF's own ("" for none)."""
    meta = record.metadata or {}
    template = meta.get(META_TEMPLATE) or meta.get("chat_template")
    return template if isinstance(template, str) else ""


def media(record: ModelRecord) -> tuple[str, ...]:
    """("vision",), ("audio",), both or (): what the paired projector takes, from its cached header
    facts, else the header itself.

    A projector the record names but whose header cannot be read still says vision: the pairing
    is the store's claim, ``verify`` and loading say what is wrong with the file, and a model
    that silently stopped listing vision would only hide it."""
    path = projector_path(record)
    if path is None:
        return ()
    info = record.metadata.get(PROJECTOR_INFO)
    if isinstance(info, dict) and ("vision" in info or "audio" in info):
        return tuple(c for c in (VISION, AUDIO) if info.get(c) is True)
    try:
        return read_projector(path).capabilities
    except (InvalidModelFile, OSError) as exc:
        logger.info("%s: projector unreadable (still listed as vision): %s", record.name, exc)
        return (VISION,)


def capabilities(record: ModelRecord, settings: Settings | None = None) -> list[str]:
    """What the model can do, in Ollama's names and order (see the module's docstring)."""
    if record.format is Format.REMOTE:  # an upstream's model: what its /v1/models entry says
        remote = (record.metadata or {}).get("upstream_media") or ()
        return ["completion", *(c for c in (VISION, AUDIO) if c in remote)]
    found = scalars(record)
    pool = pooling(record, settings)
    arch = str((record.metadata or {}).get("architecture") or "")
    out = []
    # A GGUF that declares its own pooling (or an encoder) is an embedding model, as Ollama
    # counts it; a generative model given a pooling override does both.
    if arch not in ENCODERS and native_pooling(record) in (None, "none"):
        out.append("completion")
    if pool is not None and pool not in ("none", "rank"):
        out.append("embedding")
    takes = media(record)
    # A GGUF with its encoder inside (``ARCH.vision.block_count``, as Ollama's own converts have) sees too.
    if VISION in takes or found.get("clip.has_vision_encoder") or found.get(f"{arch}.vision.block_count"):
        out.append(VISION)
    if AUDIO in takes or found.get(f"{arch}.audio.block_count"):
        out.append(AUDIO)
    template = chat_template(record)
    if "completion" in out and template_uses_tools(template or None):
        out.append("tools")
    if any(all(isinstance(found.get(k), int) and found[k] >= 0 for k in keys) for keys in _FIM_KEYS):
        out.append("insert")
    if "completion" in out and detect_format(template or None) is not None:
        out.append("thinking")
    return out
