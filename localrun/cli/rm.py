"""``localrun rm``: remove models, deleting only the files localrun downloaded."""

from __future__ import annotations

import click

from localrun.cli.common import open_store
from localrun.cli.output import console


@click.command("rm")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def rm_cmd(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Remove models. Deletes only files localrun downloaded and no other model uses."""
    store = open_store(ctx)
    for name in names:
        record = store.remove(name)
        kept = "" if record.owned else " (files left in place: localrun did not download them)"
        console().print(f"removed [bold]{record.name}[/]{kept}", highlight=False)


COMMAND = rm_cmd
