"""``localrun hw``: this machine's hardware, and which runtimes can run here."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from localrun.cli.output import console, settings_from

if TYPE_CHECKING:
    from localrun.runtimes.base import RuntimeStatus


@click.command("hw")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def hw_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show this machine's hardware and which runtimes can run here."""
    from localrun.planning.facts import machine_facts, status_cells

    settings = settings_from(ctx)
    hw, statuses = machine_facts(settings)
    if as_json:
        data = {"hardware": hw.to_dict(), "runtimes": {n: _status_dict(s) for n, s in statuses.items()}}
        click.echo(json.dumps(data, indent=2))
        return
    from localrun.planning.hardware import render_hardware

    console().print(render_hardware(hw))
    from localrun.planning.facts import backend_lines

    for line in backend_lines(statuses):
        console().print(line, highlight=False, markup=False)
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("Runtime", "Status", "Version", "Devices", "Why / how to get it"):
        table.add_column(col)
    for name, st in statuses.items():
        mark = "[green]● ready[/]" if st.available else "[red]✕ unavailable[/]"
        table.add_row(name, mark, *status_cells(st))
    console().print(table)


def _status_dict(st: RuntimeStatus) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(st)


COMMAND = hw_cmd
