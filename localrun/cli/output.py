"""Consoles and small formatters shared by the commands. Diagnostics go to stderr so
``localrun ls --json | jq`` stays clean."""

from __future__ import annotations

import functools


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
