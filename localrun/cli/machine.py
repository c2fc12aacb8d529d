"""Commands about this machine: hw (what it has) and plan (how a model would run here)."""

from __future__ import annotations

import json

import click

from localrun.cli.output import console, settings_from
from localrun.cli.run import overrides_from, plan_options


@click.command("hw")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def hw_cmd(ctx, as_json):
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


def _status_dict(st) -> dict:
    import dataclasses

    return dataclasses.asdict(st)


@click.command("plan")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
@plan_options
@click.pass_context
def plan_cmd(ctx, ref, as_json, runtime, ctx_len, gpu_layers, device, threads, parallel, speculative, draft):
    """Explain how REF would run here: runtime, device, layers, context, memory, verdict."""
    from localrun.cli.models import open_store
    from localrun.cli.run import resolve_or_builtin
    from localrun.planning.facts import default_plan

    settings = settings_from(ctx)
    store = open_store(ctx)
    record = resolve_or_builtin(store, ref)
    plan = default_plan(
        record, settings, overrides_from(runtime, ctx_len, gpu_layers, device, threads, parallel, speculative, draft)
    )
    if as_json:
        click.echo(json.dumps({"model": record.name, "plan": plan.to_dict()}, indent=2))
        return
    from localrun.planning.render import render_plan

    for line in render_plan(plan, record):
        console().print(line, highlight=False, markup=False)  # reasons name [models."NAME"] tables


COMMANDS = [hw_cmd, plan_cmd]
