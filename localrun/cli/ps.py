"""``localrun ps``: the models the running server has loaded."""

from __future__ import annotations

from typing import Any

import click

from localrun.cli.output import Column, human_bytes, print_rows, settings_from


@click.command("ps")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def ps_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show the models the running server has loaded."""

    from localrun.cli.common import call_server
    from localrun.tui.format import cache_cell

    data = call_server(settings_from(ctx), "GET", "/api/ps")

    def ttl(m: dict[str, Any]) -> str:
        left = m.get("localrun", {}).get("ttl_left_s")
        return "pinned" if left is None else f"{left:.0f} s"

    columns = [
        Column("Name", loaded_name, whole=True),
        Column("Runtime", lambda m: m.get("localrun", {}).get("runtime", "?")),
        Column("Device", lambda m: m.get("localrun", {}).get("device", "?")),
        Column("Memory", lambda m: human_bytes(m.get("size_vram") or m.get("size"))),
        Column("Idle", lambda m: f"{m.get('localrun', {}).get('idle_s', 0):.0f} s"),
        Column("Until unload", ttl),
        Column("Cache RAM", lambda m: cache_cell(m.get("localrun", {}).get("cache"), "ram")),
        Column("Cache disk", lambda m: cache_cell(m.get("localrun", {}).get("cache"), "disk")),
    ]
    print_rows(data.get("models", []), columns, as_json=as_json, empty="no models loaded")


def loaded_name(model: dict[str, Any]) -> str:
    """The name `ls` gives the model: localrun's own, not the ``NAME:latest`` Ollama's clients are shown."""
    own = model.get("localrun", {}).get("name")
    return str(own or model.get("name", "?"))


COMMAND = ps_cmd
