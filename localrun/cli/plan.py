"""``localrun plan``: how a model would run here — runtime, device, layers, context, memory, verdict."""

from __future__ import annotations

import json

import click

from localrun.cli.common import open_store, overrides_from, plan_options, resolve_or_builtin
from localrun.cli.output import console, settings_from


@click.command("plan")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
@plan_options
@click.pass_context
def plan_cmd(
    ctx: click.Context,
    ref: str,
    as_json: bool,
    runtime: str | None,
    ctx_len: int | None,
    gpu_layers: int | None,
    device: str | None,
    threads: int | None,
    parallel: int | None,
    speculative: str | None,
    draft: str | None,
) -> None:
    """Explain how REF would run here: runtime, device, layers, context, memory, verdict."""
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


COMMAND = plan_cmd
