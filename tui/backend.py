"""What the screens ask of localrun, behind one small interface.

The TUI runs in one of two ways. Embedded (the usual): it owns the store and the
ModelManager and serves them, so what it loads is what local apps see. Attached: another
localrun already serves the port, so the TUI becomes a client of that server
(:mod:`localrun.tui.remote`). Screens talk to a :class:`Backend` and never care which.

Every method may block (disk, a worker process, HTTP): screens call them from thread
workers only. Errors are :class:`~localrun.errors.LocalrunError` subclasses; the app's one
error handler shows them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from localrun.catalog import CatalogEntry
from localrun.errors import LocalrunError, UnsupportedFeature
from localrun.types import Cancel, ChatRequest, Chunk, CompletionRequest, ModelRecord, Plan, Source

if TYPE_CHECKING:
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelDetails:
    """What the library's details pane shows for one model."""

    record: ModelRecord
    plan: Plan | None
    plan_lines: tuple[str, ...] = ()
    metadata_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerifyResult:
    name: str
    ok: bool
    message: str


@dataclass(frozen=True)
class LoadedInfo:
    """One loaded model as the server screen and the header show it."""

    name: str
    runtime: str = "?"
    device: str = "?"
    memory_bytes: int | None = None
    idle_s: float | None = None
    ttl_left_s: float | None = None
    pinned: bool = False
    active: int = 0
    #: The prompt cache's numbers (``ModelManager.cache_stats``); None for a runtime without one.
    cache: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_manager(cls, d: dict[str, Any]) -> LoadedInfo:
        return cls(
            name=d["name"],
            runtime=d.get("runtime") or "?",
            device=d.get("device") or "?",
            memory_bytes=d.get("memory_bytes"),
            idle_s=d.get("idle_s"),
            ttl_left_s=d.get("ttl_left_s"),
            pinned=bool(d.get("pinned")),
            active=int(d.get("active") or 0),
            cache=d.get("cache") if isinstance(d.get("cache"), dict) else None,
        )


class Backend(Protocol):
    """The operations the screens need. Blocking; call from thread workers."""

    mode: ClassVar[str]  # "embedded" | "attached"
    #: Whether plans, verify and GGUF details are available (not over the Ollama API).
    can_plan: ClassVar[bool]

    def list_models(self) -> list[ModelRecord]: ...
    def catalog(self) -> list[CatalogEntry]: ...  # the models with their source labels (the library)
    def upstreams(self) -> list[dict[str, Any]]: ...
    def plan(self, record: ModelRecord) -> Plan | None: ...
    def details(self, name: str) -> ModelDetails: ...
    def loaded(self) -> list[LoadedInfo]: ...
    def load(self, name: str, *, pin: bool | None = None) -> None: ...
    def unload(self, name: str) -> bool: ...
    def set_pin(self, name: str, pinned: bool) -> None: ...
    def delete(self, name: str) -> ModelRecord | None: ...
    def verify(self, name: str) -> VerifyResult: ...
    def stream(self, name: str, req: ChatRequest | CompletionRequest, cancel: Cancel) -> Iterator[Chunk]: ...
    def close(self) -> None: ...


def metadata_lines(record: ModelRecord) -> tuple[str, ...]:
    """The GGUF metadata worth a line each, in a stable order; long values are cut."""
    from localrun.tui.format import human_bytes

    meta = dict(record.metadata)
    lines = [f"{record.name} · {record.format.value} · {human_bytes(record.size)} · {record.source.value}"]
    preferred = (
        "architecture",
        "name",
        "quant",
        "parameters",
        "context_length",
        "block_count",
        "layers",
        "embedding_length",
        "head_count",
        "head_count_kv",
        "vocab_size",
        "license",
    )
    keys = [k for k in preferred if k in meta] + sorted(k for k in meta if k not in preferred and k != "chat_template")
    for key in keys:
        value = meta[key]
        if isinstance(value, (list, tuple, dict)):
            value = f"{type(value).__name__} of {len(value)}"
        text = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
        if len(text) > 80:
            text = text[:77] + "…"
        lines.append(f"{key:<16} {text}")
    if meta.get("chat_template"):
        lines.append(f"{'chat_template':<16} {len(str(meta['chat_template'])):,} chars")
    if record.repo:
        lines.append(f"{'repo':<16} {record.repo}" + (f" @ {record.revision[:12]}" if record.revision else ""))
    lines.append(f"{'path':<16} {record.path}")
    return tuple(lines)


def plan_lines(plan: Plan, record: ModelRecord) -> tuple[str, ...]:
    """The plan in the words ``localrun plan`` prints (planning.render), for the Library's details."""
    from localrun.planning.render import render_plan

    return tuple(str(line) for line in render_plan(plan, record))


class LocalBackend:
    """The embedded backend: this process's store and ModelManager."""

    mode: ClassVar[str] = "embedded"
    can_plan: ClassVar[bool] = True

    def __init__(self, *, store: ModelStore, manager: ModelManager) -> None:
        self.store = store
        self.manager = manager

    def list_models(self) -> list[ModelRecord]:
        return [e.record for e in self.catalog()]

    def catalog(self) -> list[CatalogEntry]:
        local = sorted(self.store.list(), key=lambda r: r.name)
        return self.manager.catalog(local, with_capabilities=True)

    def upstreams(self) -> list[dict[str, Any]]:
        return self.manager.upstream_status()

    def plan(self, record: ModelRecord) -> Plan | None:
        if record.source is Source.UPSTREAM:
            return None  # its server plans it
        return self.manager.plan_for(record)

    def details(self, name: str) -> ModelDetails:
        record = self.manager.resolve(name)
        if record.source is Source.UPSTREAM:
            where = ", ".join(record.metadata.get("upstreams", ()))
            return ModelDetails(
                record,
                None,
                (f"Served by upstream {where}; it plans and places the model itself.",),
                metadata_lines(record),
            )
        try:
            plan = self.manager.plan_for(record)  # what self.plan gives a model that is not an upstream's
        except LocalrunError as exc:
            # A model the planner refuses still has metadata worth reading; say why there is no plan.
            return ModelDetails(record, None, (f"No plan: {exc}",), metadata_lines(record))
        return ModelDetails(record, plan, plan_lines(plan, record), metadata_lines(record))

    def loaded(self) -> list[LoadedInfo]:
        cache = self.manager.cache_stats()
        return [LoadedInfo.from_manager({**d, "cache": cache.get(d["name"])}) for d in self.manager.loaded()]

    def load(self, name: str, *, pin: bool | None = None) -> None:
        self.manager.load(name, pin=pin)

    def unload(self, name: str) -> bool:
        return self.manager.unload(name, reason="unloaded from the TUI")

    def set_pin(self, name: str, pinned: bool) -> None:
        self.manager.load(name, pin=pinned)

    def delete(self, name: str) -> ModelRecord | None:
        record = self.store.resolve(name)
        self.manager.unload(record.name, reason="deleted from the TUI")
        return self.store.remove(record.name)

    def verify(self, name: str) -> VerifyResult:
        verify = getattr(self.store, "verify", None)
        if verify is None:
            raise UnsupportedFeature(
                "this model store cannot verify files yet",
                hint="update localrun; `localrun verify` re-hashes on demand",
            )
        result = verify(name)
        message = _verify_message(name, result)
        return VerifyResult(name, True, message)

    def stream(self, name: str, req: ChatRequest | CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        return self.manager.stream(name, req, cancel)

    def close(self) -> None:
        self.manager.shutdown()


def _verify_message(name: str, result: Any) -> str:
    """Words for whatever the store's verify returned (a record, a list of files, a count)."""
    files = getattr(result, "files", None)
    if isinstance(result, (list, tuple)):
        files = result
    count = len(files) if files is not None else None
    return f"{name}: " + (f"{count} file(s) match their sha256" if count is not None else "files match their sha256")
