"""``localrun ls``: the registered models, the upstreams' and (``--all``) those other tools keep on disk."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from localrun.cli.common import open_store
from localrun.cli.output import Column, err_console, human_bytes, print_rows

if TYPE_CHECKING:
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings
    from localrun.types import ModelRecord


def _row(record: ModelRecord, settings: Settings | None = None) -> dict[str, Any]:
    from localrun.modelstore.capabilities import capabilities
    from localrun.modelstore.projector import projector_path

    meta = record.metadata
    return {
        "name": record.name,
        "format": record.format.value,
        "architecture": meta.get("architecture"),
        "quant": meta.get("quant"),
        "size": record.size,
        "context_length": meta.get("context_length"),
        "capabilities": capabilities(record, settings),
        "projector": projector_path(record),
        "source": record.source.value,
        "owned": record.owned,
        "path": record.path,
    }


@click.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--all", "show_all", is_flag=True, help="Also list models other tools keep on disk (HF cache, Ollama, LM Studio)."
)
@click.pass_context
def ls_cmd(ctx: click.Context, as_json: bool, show_all: bool) -> None:
    """List registered models."""
    store = open_store(ctx)
    records = list(store.list())
    extra = []
    if show_all:
        from localrun.modelstore.sources import discover_all

        known = {r.path for r in records}
        extra = [r for r in discover_all(store.settings) if r.path not in known]
    rows = [_row(r, store.settings) for r in records] + [dict(_row(r, store.settings), registered=False) for r in extra]
    rows += upstream_rows(store, records)
    ready = [] if as_json else builtin_rows(store, records)  # JSON lists what is registered
    ctx_cell = Column(
        "Context", lambda r: f"{r['context_length']:,}" if r.get("context_length") else "—", right=True, optional=1
    )
    columns = [
        Column("Name", lambda r: r["name"] if r.get("registered", True) else f"[dim]{r['name']}[/]", whole=True),
        Column("Format", lambda r: r["format"], optional=4),
        Column("Arch", lambda r: r["architecture"] or "—", optional=3),
        Column("Quant", lambda r: r["quant"] or "—"),
        Column("Size", lambda r: human_bytes(r["size"]), right=True),
        ctx_cell,
        Column("Capabilities", lambda r: ", ".join(r.get("capabilities") or ()) or "—", wraps=True),
        Column("Source", lambda r: r["source"], optional=2),
    ]
    print_rows(
        rows + ready,
        columns,
        as_json=as_json,
        empty="no models yet — `localrun import FILE.gguf` or `localrun pull ORG/REPO`",
    )
    if ready:
        err_console().print(
            "[dim]built-in (dimmed): ready, registered the first time it runs — "
            'localrun run smollm2-135m-instruct "Hi"[/]',
            highlight=False,
        )
    if as_json or not rows:
        return
    total = sum(r["size"] for r in rows if r.get("registered", True) and r["owned"])
    err_console().print(f"{len(records)} registered · {human_bytes(total)} downloaded by localrun", highlight=False)


def builtin_rows(store: ModelStore, records: list[ModelRecord]) -> list[dict[str, Any]]:
    """The models that come with localrun and are not registered yet, as dimmed rows: a new home's
    first ``ls`` shows what runs at once instead of "no models yet". Nothing is registered or
    assembled here (SmolLM2's header is read in place; Gemma's size is its chunks')."""
    import importlib

    from localrun.modelstore import builtins as b

    names = {r.name for r in records}
    rows = []
    path = b.chat_model_path() if b.CHAT_MODEL_NAME not in names else None
    if path is not None:
        record = b.builtin_record(b.CHAT_MODEL_NAME, path, b.CHAT_MODEL_SHA256, owned=False)
        rows.append(dict(_row(record, store.settings), registered=False))
    if b.DEFAULT_MODEL_NAME not in names:
        try:
            package = importlib.import_module(b.DEFAULT_MODEL_PACKAGE)
        except ImportError:
            return rows
        size = sum(p.stat().st_size for p in package.chunk_paths())
        gemma = {"name": b.DEFAULT_MODEL_NAME, "format": "gguf", "architecture": "gemma3", "quant": "Q4_K_M"}
        rows.append({**gemma, "size": size, "capabilities": ["completion"], "source": "builtin", "registered": False})
    return rows


def upstream_rows(store: ModelStore, records: list[ModelRecord]) -> list[dict[str, Any]]:
    """The upstreams' models as ls rows, from the manager's catalog, probed now (no server probed them)."""
    if not store.settings.upstreams:
        return []
    from localrun.manager import ModelManager

    manager = ModelManager(store.settings, store)
    try:
        listed = [e for e in manager.catalog(records, probe=True) if e.upstreams]
    finally:
        manager.shutdown()
    return [dict(_row(e.record, store.settings), source=e.source, health=e.health, size=0) for e in listed]


COMMAND = ls_cmd
