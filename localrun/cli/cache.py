"""``localrun cache``: what the prompt cache keeps on disk, and clearing it (docs/kv-cache.md).

Both commands read only the files' headers, so they run with no model loaded and no llama.cpp;
a server may be running meanwhile (clear takes the same lock its evictions take).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localrun.cli.output import Column, console, err_console, human_bytes, print_rows, settings_from

if TYPE_CHECKING:
    from localrun.settings import Settings


def cache_root(settings: Settings) -> Path:
    """Where the disk tier lives: ``cache.kv_dir``, else ``<cache_dir>/kv``."""
    return settings.cache.kv_dir or settings.cache_dir / "kv"


def cache_rows(root: Path) -> list[dict[str, Any]]:
    """One row per state key (a model under one runtime and context shape), newest use first."""
    from localrun.runtimes.llamacpp.cache.kv_disk import list_entries
    from localrun.runtimes.llamacpp.cache.kv_root import read_key_file

    by_key = defaultdict(list)
    for entry in list_entries(root):
        by_key[entry.path.parent].append(entry)
    rows = []
    for folder, entries in by_key.items():
        info = read_key_file(folder)
        last = max(e.used_at for e in entries)
        rows.append(
            {
                "model": info.get("model_name") or "",
                "digest": folder.name,
                "model_sha256": info.get("model_sha256", ""),
                "runtime": info.get("runtime", ""),
                "params": info.get("params", {}),
                "entries": len(entries),
                "checkpoints": sum(e.kind == "checkpoint" for e in entries),
                "tokens": sum(len(e.tokens) for e in entries),
                "bytes": sum(e.nbytes for e in entries),
                "last_used": dt.datetime.fromtimestamp(last, dt.UTC).isoformat(timespec="seconds"),
            }
        )
    rows.sort(key=lambda r: r["last_used"], reverse=True)
    return rows


@click.group("cache")
def cache_group() -> None:
    """The prompt cache on disk: prefixes kept across restarts, unloads and model swaps."""


@cache_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def ls_cmd(ctx: click.Context, as_json: bool) -> None:
    """List cached prefixes per model: entries, tokens, bytes and when last used."""
    root = cache_root(settings_from(ctx))
    rows = cache_rows(root)
    columns = [
        Column("Model", lambda r: r["model"] or "—"),
        Column("Key", lambda r: r["digest"][:12]),
        Column("Entries", lambda r: str(r["entries"]), right=True),
        Column("Tokens", lambda r: f"{r['tokens']:,}", right=True),
        Column("Size", lambda r: human_bytes(r["bytes"]), right=True),
        Column("Last used", lambda r: r["last_used"].replace("T", " ").removesuffix("+00:00") + " UTC"),
    ]
    print_rows(rows, columns, as_json=as_json, empty=f"no cached prefixes in {root}")
    if rows and not as_json:
        total = sum(r["bytes"] for r in rows)
        err_console().print(f"{human_bytes(total)} in {root}", highlight=False)


@cache_group.command("clear")
@click.argument("model", required=False)
@click.pass_context
def clear_cmd(ctx: click.Context, model: str | None) -> None:
    """Remove cached prefixes: MODEL's (a model name, or a key's first 8+ hex digits), or all."""
    from localrun.runtimes.llamacpp.cache.kv_disk import clear

    root = cache_root(settings_from(ctx))
    known = sorted({r["model"] for r in cache_rows(root) if r["model"]})
    files, nbytes = clear(root, model)
    whose = f" of {model}" if model else ""
    if model and not files:
        hint = f" (cached: {', '.join(known)})" if known else ""
        err_console().print(f"nothing cached for {model!r}{hint}", highlight=False)
        return
    if not files:
        err_console().print(f"nothing cached in {root}", highlight=False)
        return
    noun = "file" if files == 1 else "files"
    console().print(f"removed {files} {noun}{whose} ({human_bytes(nbytes)}) from {root}", highlight=False)


COMMAND = cache_group
