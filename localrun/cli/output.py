"""What every command shares: settings loaded once per invocation, the consoles, small
formatters. Diagnostics go to stderr so ``localrun ls --json | jq`` stays clean."""

from __future__ import annotations

import functools
import logging
import sys

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
