"""The local store's commands: import, ls (local, upstream and discoverable models) and rm."""

from __future__ import annotations

from pathlib import Path

import click

from localrun.cli.output import Column, console, err_console, human_bytes, print_rows, settings_from


def open_store(ctx: click.Context):
    from localrun.modelstore.store import ModelStore

    return ModelStore(settings_from(ctx))


@click.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--mmproj",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The model's multimodal projector (mmproj*.gguf) for images/audio. PATH may also be a registered "
    "model's name, to give it one.",
)
@click.option("--name", help="Name to register it under (default: from the file name).")
@click.option("--replace", is_flag=True, help="Replace a model registered under the same name.")
@click.option(
    "--pooling",
    type=click.Choice(["mean", "cls", "last", "none", "rank"]),
    help="Pool embeddings this way (lets a generative model serve /v1/embeddings).",
)
@click.option(
    "--chat-template",
    "chat_template",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A Jinja chat template to use instead of the file's own.",
)
@click.pass_context
def import_cmd(
    ctx: click.Context,
    path: Path,
    mmproj: Path | None,
    name: str | None,
    replace: bool,
    pooling: str | None,
    chat_template: Path | None,
) -> None:
    """Register a local GGUF file (or MLX folder) in place, without copying it."""
    from localrun.modelstore.projector import capabilities

    store = open_store(ctx)
    verb = "imported"
    if mmproj is not None and not path.expanduser().exists() and store.index.find(str(path)) is not None:
        record, verb = store.pair_projector(str(path), mmproj), "paired"
    elif pooling is None and chat_template is None:
        record = store.import_path(path, name=name, replace=replace, mmproj=mmproj)
    else:
        record = _import_with_overrides(store, path, name, replace, pooling, chat_template, mmproj)
    meta = record.metadata
    caps = capabilities(record)
    console().print(
        f"{verb} [bold]{record.name}[/] · {record.format.value} · {meta.get('architecture', '?')} · "
        f"{meta.get('quant') or '?'} · {human_bytes(record.size)}" + (f" · {' + '.join(caps)}" if caps else ""),
        highlight=False,
    )


def _import_with_overrides(store, path: Path, name, replace: bool, pooling, chat_template, mmproj=None):
    """Import and record the overrides in the model's index entry (re-importing the same file updates them)."""
    import dataclasses

    from localrun.planning.overrides import META_POOLING, META_TEMPLATE, META_TEMPLATE_FILE, read_chat_template

    record = store.inspect_path(path, name=name)
    if mmproj is not None:
        record = store.with_projector(record, mmproj)
    meta = dict(record.metadata)
    if pooling is not None:
        meta[META_POOLING] = pooling
    if chat_template is not None:
        meta[META_TEMPLATE] = read_chat_template(chat_template)
        meta[META_TEMPLATE_FILE] = str(chat_template)
    existing = store.index.find(record.name)
    same = existing is not None and existing.path == record.path
    return store.index.add(dataclasses.replace(record, metadata=meta), replace=replace or same)


def _row(record) -> dict:
    from localrun.modelstore.projector import capabilities, projector_path

    meta = record.metadata
    return {
        "name": record.name,
        "format": record.format.value,
        "architecture": meta.get("architecture"),
        "quant": meta.get("quant"),
        "size": record.size,
        "context_length": meta.get("context_length"),
        "capabilities": list(capabilities(record)),
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
        from localrun.modelstore.discovery import discover_all

        known = {r.path for r in records}
        extra = [r for r in discover_all(store.settings) if r.path not in known]
    rows = [_row(r) for r in records] + [dict(_row(r), registered=False) for r in extra]
    rows += upstream_rows(store, records)
    ctx_cell = Column("Context", lambda r: f"{r['context_length']:,}" if r.get("context_length") else "—", right=True)
    columns = [
        Column("Name", lambda r: r["name"] if r.get("registered", True) else f"[dim]{r['name']}[/]"),
        Column("Format", lambda r: r["format"]),
        Column("Arch", lambda r: r["architecture"] or "—"),
        Column("Quant", lambda r: r["quant"] or "—"),
        Column("Size", lambda r: human_bytes(r["size"]), right=True),
        ctx_cell,
        Column("Media", lambda r: ", ".join(r.get("capabilities") or ()) or "—"),
        Column("Source", lambda r: r["source"]),
    ]
    print_rows(
        rows, columns, as_json=as_json, empty="no models yet — `localrun import FILE.gguf` or `localrun pull ORG/REPO`"
    )
    if as_json or not rows:
        return
    total = sum(r["size"] for r in rows if r.get("registered", True) and r["owned"])
    err_console().print(f"{len(records)} registered · {human_bytes(total)} downloaded by localrun", highlight=False)


@click.command("rm")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def rm_cmd(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Remove models. Deletes only files localrun downloaded and no other model uses."""
    store = open_store(ctx)
    for name in names:
        record = store.remove(name)
        kept = "" if record.owned else " (files left in place: localrun did not download them)"
        console().print(f"removed [bold]{record.name}[/]{kept}", highlight=False)


def upstream_rows(store, records) -> list[dict]:
    """The upstreams' models as ls rows, from the manager's catalog, probed now (no server probed them)."""
    if not store.settings.upstreams:
        return []
    from localrun.manager import ModelManager

    manager = ModelManager(store.settings, store)
    try:
        listed = [e for e in manager.catalog(records, probe=True) if e.upstreams]
    finally:
        manager.shutdown()
    return [dict(_row(e.record), source=e.source, health=e.health, size=0) for e in listed]


COMMANDS = [import_cmd, ls_cmd, rm_cmd]
