"""``localrun import``: register a local GGUF file (or MLX folder) in place, without copying it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from localrun.cli.common import open_store
from localrun.cli.output import console, human_bytes

if TYPE_CHECKING:
    from localrun.modelstore.store import ModelStore
    from localrun.types import ModelRecord


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
    from localrun.modelstore.capabilities import media

    store = open_store(ctx)
    verb = "imported"
    if mmproj is not None and not path.expanduser().exists() and store.index.find(str(path)) is not None:
        record, verb = store.pair_projector(str(path), mmproj), "paired"
    elif pooling is None and chat_template is None:
        record = store.import_path(path, name=name, replace=replace, mmproj=mmproj)
    else:
        record = _import_with_overrides(store, path, name, replace, pooling, chat_template, mmproj)
    meta = record.metadata
    caps = media(record)
    console().print(
        f"{verb} [bold]{record.name}[/] · {record.format.value} · {meta.get('architecture', '?')} · "
        f"{meta.get('quant') or '?'} · {human_bytes(record.size)}" + (f" · {' + '.join(caps)}" if caps else ""),
        highlight=False,
    )


def _import_with_overrides(
    store: ModelStore,
    path: Path,
    name: str | None,
    replace: bool,
    pooling: str | None,
    chat_template: Path | None,
    mmproj: Path | None = None,
) -> ModelRecord:
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


COMMAND = import_cmd
