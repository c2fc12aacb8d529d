"""How a model is listed on OpenAI's wire: the entries of ``/v1/models``, local and upstream.

``capabilities`` are :func:`localrun.modelstore.capabilities.capabilities` (the catalog carries
them), the same answer ``/api/show``, ``localrun ls`` and the TUI give.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localrun.modelstore.capabilities import media
from localrun.types import ModelRecord

if TYPE_CHECKING:
    from localrun.catalog import CatalogEntry


def context_length(record: ModelRecord) -> int | None:
    """The context the model was trained for, where its metadata says."""
    meta = record.metadata or {}
    value = meta.get("context_length")
    return value if isinstance(value, int) and value > 0 else None


def modalities(record: ModelRecord) -> dict[str, bool]:
    """What the model takes besides text, in llama-server's ``/props`` shape (its projector's header)."""
    takes = media(record)
    return {"vision": "vision" in takes, "audio": "audio" in takes}


def openai_model(
    record: ModelRecord, loaded: dict[str, Any] | None, capabilities: list[str] | None = None
) -> dict[str, Any]:
    """One /v1/models entry. ``capabilities`` (Ollama's names, as /api/show has them) gain
    llama-server's ``multimodal`` for a model with a projector, which its clients look for."""
    entry: dict[str, Any] = {
        "id": record.name,
        "object": "model",
        "created": int(record.added_at or 0),
        "owned_by": "localrun",
        "context_length": context_length(record),
        "loaded": loaded is not None,
    }
    if loaded is not None:
        entry["loaded_context_length"] = loaded.get("n_ctx")
    if capabilities is not None:
        media = modalities(record)
        entry["capabilities"] = [*capabilities, *(["multimodal"] if any(media.values()) else [])]
        entry["modalities"] = media
    return entry


def openai_upstream_model(entry: CatalogEntry) -> dict[str, Any]:
    """An upstream model (a catalog entry) in /v1/models: owned by ``upstream:NAME``, with its health."""
    model = openai_model(entry.record, None)
    model["owned_by"] = "upstream:" + ",".join(entry.upstreams)
    model["upstream"] = {"names": list(entry.upstreams), "model": entry.upstream_model, "health": entry.health}
    return model
