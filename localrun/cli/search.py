"""``localrun search``: find models on the hub."""

from __future__ import annotations

import dataclasses

import click

from localrun.cli.output import Column, print_rows, settings_from


@click.command("search")
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["gguf", "mlx", "mlc"]), help="Only repos in this format.")
@click.option("--limit", type=click.IntRange(1, 200), default=20)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def search_cmd(ctx: click.Context, query: str, fmt: str | None, limit: int, as_json: bool) -> None:
    """Search the hub for models."""
    from localrun.modelstore.hub import search

    results = search(query, format=fmt, limit=limit, settings=settings_from(ctx))
    columns = [
        Column("Repo", lambda r: r.name + (" [dim](gated)[/]" if r.gated else "")),
        Column("Downloads", lambda r: f"{r.downloads or 0:,}", right=True),
        Column("Likes", lambda r: f"{r.likes or 0:,}", right=True),
        Column("Updated", lambda r: str(r.updated or "—")[:10]),
    ]
    json_rows = [dataclasses.asdict(r) for r in results] if as_json else None
    print_rows(results, columns, as_json=as_json, empty=f"no repos match {query!r}", json_rows=json_rows)


COMMAND = search_cmd
