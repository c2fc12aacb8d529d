"""What every command shares: settings loaded once per invocation, the consoles, small
formatters. Diagnostics go to stderr so ``localrun ls --json | jq`` stays clean."""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from localrun.planning.hardware import human_bytes as human_bytes  # the one byte formatter (re-exported)

if TYPE_CHECKING:
    from rich.console import Console

    from localrun.settings import Settings

#: A command function, as the option decorators hand it back.
F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def console() -> Console:
    from rich.console import Console

    return Console()


@functools.cache
def err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


def settings_from(ctx: click.Context, **overrides: Any) -> Settings:
    """Load settings once per invocation and set up logging to stderr."""
    obj = ctx.find_root().obj
    if "settings" not in obj:
        from localrun.settings import load_settings

        s = load_settings(**overrides)
        level = (obj.get("log_level") or s.log_level).upper()
        logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        obj["settings"] = s
    settings: Settings = obj["settings"]
    return settings


@dataclass(frozen=True)
class Column:
    """One column of a listing: its header, how a row becomes its cell, and its alignment."""

    header: str
    cell: Callable[[Any], str]
    right: bool = False
    #: Never cut (a name a person copies): the column keeps its longest cell's width and the
    #: others wrap or shrink; only a cell wider than the screen folds onto a second line.
    whole: bool = False
    #: A list (", "-separated) that may wrap between its items when the screen is narrow.
    wraps: bool = False
    #: Left out when the screen is too narrow for every column whole: the highest number first; 0 never.
    optional: int = 0


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
    from rich.text import Text

    def widest(col: Column, texts: list[str]) -> int:
        parts = [p for t in texts for p in (Text.from_markup(t).plain.split(", ") if col.wraps else [t])]
        return max([Text.from_markup(p).cell_len for p in parts] + [len(col.header)])

    cells = {col.header: [col.cell(row) for row in rows] for col in columns}
    need = {col.header: widest(col, cells[col.header]) for col in columns}
    shown = list(columns)
    screen = console().width
    for col in sorted((c for c in columns if c.optional), key=lambda c: -c.optional):
        if sum(need[c.header] + 2 for c in shown) <= screen:
            break
        shown.remove(col)
    table = Table(box=None, header_style="bold")
    for col in shown:
        table.add_column(
            col.header,
            justify="right" if col.right else "left",
            min_width=min(need[col.header], screen - 2),
            no_wrap=not (col.wraps or col.whole),
            overflow="fold",
        )
    for i in range(len(rows)):
        table.add_row(*(cells[col.header][i] for col in shown))
    console().print(table)


def ctx_option(help: str) -> Callable[[F], F]:
    """``--ctx N`` with one name, destination (``ctx_len``) and bound on every command that loads a model;
    only the help, which says what the command does with it, differs."""
    return click.option("--ctx", "ctx_len", type=click.IntRange(64, None), default=None, help=help)


#: Where :func:`placement_options` keeps what was given, in the click context's ``meta``.
PLACEMENT = "localrun.placement"
#: The KV cache types the llama.cpp session takes (runtimes/llamacpp/context.py KV_TYPES).
KV_CHOICES = ("f16", "f32", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")


def placement_options(*, gpu_layers: bool = False) -> Callable[[F], F]:
    """``--kv-type``, ``--cpu-moe`` and ``--n-cpu-moe N`` (and ``--gpu-layers`` where ``gpu_layers``) for
    every command that plans a load. They are not parameters of the command: each lands in the
    context's meta and :func:`placement_overrides` hands them to the planner, so adding one touches
    no command's signature."""

    def keep(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None and value is not False:
            ctx.meta.setdefault(PLACEMENT, {})[param.name] = value
        return value

    def decorate(f: F) -> F:
        f = click.option(
            "--kv-type",
            type=click.Choice(KV_CHOICES, case_sensitive=False),
            expose_value=False,
            callback=keep,
            help="KV cache type for llama.cpp (default: f16, or q8_0 when only that fits the asked-for context).",
        )(f)
        f = click.option(
            "--n-cpu-moe",
            type=click.IntRange(0, None),
            expose_value=False,
            callback=keep,
            metavar="N",
            help="MoE models: keep the experts of the first N layers in RAM (default: as many as must, to fit).",
        )(f)
        f = click.option(
            "--cpu-moe",
            is_flag=True,
            default=None,
            expose_value=False,
            callback=keep,
            help="MoE models: keep every layer's experts in RAM, attention and the KV cache on the GPU.",
        )(f)
        if gpu_layers:
            f = click.option(
                "--gpu-layers",
                type=int,
                expose_value=False,
                callback=keep,
                help="Layers to offload to the GPU (-1: all).",
            )(f)
        return f

    return decorate


def placement_overrides() -> dict[str, Any]:
    """PlanOverrides fields from :func:`placement_options` of the running command ({} outside one)."""
    ctx = click.get_current_context(silent=True)
    given = dict(ctx.meta.get(PLACEMENT, {})) if ctx is not None else {}
    out: dict[str, Any] = {}
    if given.get("kv_type"):
        out["kv_type"] = given["kv_type"].lower()
    if given.get("cpu_moe"):
        out["n_cpu_moe"] = -1
    elif given.get("n_cpu_moe") is not None:
        out["n_cpu_moe"] = given["n_cpu_moe"]
    if given.get("gpu_layers") is not None:
        out["n_gpu_layers"] = given["gpu_layers"]
    return out
