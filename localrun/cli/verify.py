"""``localrun verify``: re-hash model files and name any that no longer match."""

from __future__ import annotations

import click

from localrun.cli.common import open_store
from localrun.cli.output import console


@click.command("verify")
@click.argument("names", nargs=-1)
@click.pass_context
def verify_cmd(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Re-hash model files and name any that no longer match (all models by default)."""
    from localrun.errors import VerificationFailed

    store = open_store(ctx)
    records = [store.index.get(n) for n in names] if names else store.list()
    bad = 0
    for record in records:
        try:
            store.verify(record.name)
            console().print(f"[green]ok[/]  {record.name}", highlight=False)
        except VerificationFailed as exc:
            bad += 1
            console().print(f"[red]bad[/] {record.name}: {exc.message}", highlight=False)
    if bad:
        raise VerificationFailed(
            f"{bad} of {len(records)} models failed verification", hint="pull them again, or `localrun rm` them"
        )


COMMAND = verify_cmd
