"""What every command shares: settings loaded once per invocation, the consoles, small
formatters. Diagnostics go to stderr so ``localrun ls --json | jq`` stays clean."""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click


@functools.cache
def console():
    from rich.console import Console

    return Console()


@functools.cache
def err_console():
    from rich.console import Console

    return Console(stderr=True)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "—"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def settings_from(ctx: click.Context, **overrides):
    """Load settings once per invocation and set up logging to stderr."""
    obj = ctx.find_root().obj
    if "settings" not in obj:
        from localrun.settings import load_settings

        s = load_settings(**overrides)
        level = (obj.get("log_level") or s.log_level).upper()
        logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        obj["settings"] = s
    return obj["settings"]


@dataclass(frozen=True)
class Column:
    """One column of a listing: its header, how a row becomes its cell, and its alignment."""

    header: str
    cell: Callable[[Any], str]
    right: bool = False


def print_rows(
    rows: Sequence[Any], columns: Sequence[Column], *, as_json: bool, empty: str, json_rows: Any = None
) -> None:
    """Every listing's three faces in one place: ``--json`` prints the rows (or ``json_rows``) to
    stdout, an empty listing says ``empty`` on stderr (so ``| jq`` stays clean), else a table."""
    if as_json:
        click.echo(json.dumps(list(rows) if json_rows is None else json_rows, indent=2, default=str))
        return
    if not rows:
        err_console().print(empty, highlight=False)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in columns:
        table.add_column(col.header, justify="right" if col.right else "left")
    for row in rows:
        table.add_row(*(col.cell(row) for col in columns))
    console().print(table)


def ctx_option(help: str) -> Callable:
    """``--ctx N`` with one name, destination (``ctx_len``) and bound on every command that loads a model;
    only the help, which says what the command does with it, differs."""
    return click.option("--ctx", "ctx_len", type=click.IntRange(64, None), default=None, help=help)
