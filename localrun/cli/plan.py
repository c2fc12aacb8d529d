"""``localrun plan``: how a model would run here — runtime, device, layers, context, memory, verdict."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from localrun.cli.common import open_store, overrides_from, plan_options, resolve_or_builtin
from localrun.cli.output import console, err_console, human_bytes, settings_from

if TYPE_CHECKING:
    from localrun.modelstore.store import ModelStore
    from localrun.types import ModelRecord


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
    record = resolve_or_hub(store, ref)
    plan = default_plan(
        record, settings, overrides_from(runtime, ctx_len, gpu_layers, device, threads, parallel, speculative, draft)
    )
    if as_json:
        click.echo(json.dumps({"model": record.name, "plan": plan.to_dict()}, indent=2))
        return
    from localrun.planning.render import render_plan

    for line in render_plan(plan, record):
        console().print(line, highlight=False, markup=False)  # reasons name [models."NAME"] tables


def resolve_or_hub(store: ModelStore, ref: str) -> ModelRecord:
    """A model in the store by any of its names, else the hub repo ``ref`` names, read from the hub
    without downloading it (sizes from the listing, the GGUF header by range requests)."""
    from localrun.errors import DownloadFailed, InvalidName, ModelNotFound

    try:
        return resolve_or_builtin(store, ref)
    except ModelNotFound as missing:
        from localrun.modelstore.hub_header import hub_record
        from localrun.modelstore.refs import parse_ref

        try:
            parse_ref(ref)
        except InvalidName:
            raise missing from None
        try:
            record = hub_record(ref, store.settings)
        except DownloadFailed as exc:
            raise DownloadFailed(
                f"{ref} is not in the store, and the hub could not be asked about it: {exc.message}",
                hint="connect (or point HF_ENDPOINT / hub.endpoint at a mirror) and plan it again; "
                "or `localrun pull` it where there is a network and plan the copy",
            ) from None
        except ModelNotFound as exc:
            raise ModelNotFound(f"{ref} is not in the store, and the hub says: {exc.message}", hint=exc.hint) from None
    remote = record.metadata.get("remote") or {}
    err_console().print(
        f"{ref} is not in the store: read from {remote.get('endpoint')} ({remote.get('repo')}@"
        f"{str(remote.get('commit'))[:10]}, {human_bytes(remote.get('header_bytes'))} of header in "
        f"{remote.get('seconds')} s, nothing downloaded); `localrun pull {ref}` fetches it",
        highlight=False,
        markup=False,
    )
    return record


COMMAND = plan_cmd
