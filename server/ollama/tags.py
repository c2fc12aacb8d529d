"""How a model is listed on Ollama's wire: ``/api/tags`` and ``/api/ps`` entries, and the
details, digest and times ``/api/show`` shares with them."""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any

from localrun.modelstore.identity import registration_digest, tagged
from localrun.types import ModelRecord

if TYPE_CHECKING:
    from localrun.catalog import CatalogEntry
    from localrun.manager import ModelManager
    from localrun.settings import Settings

#: A time far away for "never unloads", as Ollama reports pinned models.
_FOREVER = dt.datetime(2318, 1, 1, tzinfo=dt.UTC)


def iso(ts: float | None = None) -> str:
    """RFC 3339 in UTC with a Z, as Go's time.Time marshals it."""
    when = dt.datetime.fromtimestamp(time.time() if ts is None else ts, tz=dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parameter_size(n: Any) -> str:
    if not isinstance(n, int) or n <= 0:
        return ""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0", "")
    return str(n)


def details(record: ModelRecord) -> dict[str, Any]:
    meta = record.metadata or {}
    family = meta.get("architecture") or ""
    return {
        "parent_model": "",
        "format": record.format.value,
        "family": family,
        "families": [family] if family else None,
        "parameter_size": _parameter_size(meta.get("n_params")),
        "quantization_level": meta.get("quant") or "",
    }


def config_overrides(settings: Settings | None, name: str) -> dict[str, Any]:
    """What config.toml's ``[models."*"]`` and ``[models."NAME"]`` override for ``name`` (None: nothing)."""
    configured = getattr(settings, "models", None) or {}
    out: dict[str, Any] = {}
    for key in ("*", name):
        entry = configured.get(key)
        if entry is not None:
            out.update({f"config.{k}": v for k, v in entry.model_dump(exclude_none=True).items()})
    return out


def digest(record: ModelRecord, settings: Settings | None = None) -> str:
    """The registration's digest (see :func:`localrun.modelstore.identity.registration_digest`)."""
    return registration_digest(record, config_overrides(settings, record.name))


def ollama_tag(record: ModelRecord, settings: Settings | None = None) -> dict[str, Any]:
    """One model as /api/tags lists it: named ``NAME:latest`` when untagged, as Ollama's are (its
    clients send that name back, and it resolves); localrun's own name under "localrun"."""
    return {
        "name": tagged(record.name),
        "model": tagged(record.name),
        "modified_at": iso(record.added_at or None),
        "size": record.size,
        "digest": digest(record, settings),
        "details": details(record),
        "localrun": {"name": record.name, "source": record.source.value},
    }


def ollama_ps_entry(
    record: ModelRecord | None, info: dict[str, Any], settings: Settings | None = None
) -> dict[str, Any]:
    """One loaded model as /api/ps shows it, with localrun's own view under "localrun"."""
    memory = info.get("memory_bytes") or (record.size if record else 0)
    on_gpu = str(info.get("device", "cpu")).lower() not in ("cpu", "")
    ttl = info.get("ttl_left_s")
    now = dt.datetime.now(tz=dt.UTC)
    # A keep_alive past _FOREVER (1e20 s is a legal number) would overflow datetime: it is forever.
    expires = _FOREVER if ttl is None or ttl >= (_FOREVER - now).total_seconds() else now + dt.timedelta(seconds=ttl)
    return {
        "name": tagged(str(info.get("name"))),
        "model": tagged(str(info.get("name"))),
        "size": memory,
        "size_vram": memory if on_gpu else 0,
        "digest": digest(record, settings) if record else "",
        "details": details(record) if record else {},
        "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "context_length": info.get("n_ctx"),
        "localrun": info,
    }


def upstream_listing(manager: ModelManager, records: list[ModelRecord]) -> list[CatalogEntry]:
    """The upstream entries of the manager's catalog, listed beside ``records`` (the local store's)."""
    return [e for e in manager.catalog(records) if e.upstreams]


def ollama_upstream_tag(entry: CatalogEntry) -> dict[str, Any]:
    tag = ollama_tag(entry.record)
    tag["localrun"] = {
        "name": entry.record.name,
        "source": "upstream " + ",".join(entry.upstreams),
        "health": entry.health,
    }
    return tag
