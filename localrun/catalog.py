"""What every listing shows of a model (``ls``, ``/v1/models``, ``/api/tags``, the TUI's library):
the store's records and the upstreams' models side by side, each with the source label a person
reads. :meth:`localrun.manager.ModelManager.catalog` builds the list."""

from __future__ import annotations

from dataclasses import dataclass

from localrun.types import ModelRecord, Source


@dataclass(frozen=True)
class CatalogEntry:
    """One model as every listing shows it (``ls``, ``/v1/models``, ``/api/tags``, the TUI library).

    Local store records and upstream models side by side, so no front end writes the
    upstream listing itself; ``source`` is the label a person reads.
    """

    name: str
    record: ModelRecord
    source: str  # "hf", "imported"…, or "upstream NAME (health)"
    health: str | None = None  # an upstream model's health ("up", "cooldown", "unknown", "down"); None: local
    upstreams: tuple[str, ...] = ()  # the upstreams serving it; () for a local model
    upstream_model: str | None = None  # the id its upstreams know it by
    #: What it can do (modelstore/capabilities.py), filled by ``catalog(with_capabilities=True)``.
    capabilities: tuple[str, ...] = ()


def source_label(record: ModelRecord) -> str:
    """``upstream NAME (health)`` for an upstream model, the plain source otherwise."""
    if record.source is not Source.UPSTREAM:
        return str(record.source.value)
    names = ",".join(record.metadata.get("upstreams", ()))
    health = record.metadata.get("upstream_health")
    return f"upstream {names}" + (f" ({health})" if health else "")
