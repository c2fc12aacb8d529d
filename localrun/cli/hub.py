"""Hub commands: pull (verified, resumable), search, verify."""

from __future__ import annotations

import dataclasses

import click

from localrun.cli.models import open_store
from localrun.cli.output import Column, console, err_console, human_bytes, print_rows, settings_from


class _Bars:
    """Per-file rich progress bars with speed and ETA, fed by the downloader's callback."""

    def __init__(self, progress):
        self.progress = progress
        self.tasks: dict[str, int] = {}

    def __call__(self, p) -> None:
        task = self.tasks.get(p.file)
        if task is None:
            task = self.tasks[p.file] = self.progress.add_task(p.file, total=p.total or None)
        self.progress.update(task, completed=p.done, total=p.total or None, description=f"{p.file} [dim]{p.phase}[/]")


@click.command("pull")
@click.argument("ref")
@click.option("--revision", help="Branch, tag or commit (default: main).")
@click.option("--offline", is_flag=True, help="Use local files only (also HF_HUB_OFFLINE=1).")
@click.option("--trust-remote-code", is_flag=True, help="Allow MLX repos that ship Python code.")
@click.option("--allow-native", is_flag=True, help="Allow MLC repos that ship native libraries.")
@click.option(
    "--no-mmproj",
    "no_mmproj",
    is_flag=True,
    help="Skip the repo's multimodal projector (mmproj*.gguf): the model alone, text only.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not print the plan before downloading (scripts).")
@click.pass_context
def pull_cmd(ctx, ref, revision, offline, trust_remote_code, allow_native, no_mmproj, yes):
    """Download a model from the Hugging Face hub (or HF_ENDPOINT's mirror), verified.

    REF: org/repo, org/repo:Q5_K_M, hf.co/org/repo:QUANT or org/repo/path/file.gguf.
    A GGUF repo's projector (mmproj*.gguf, for images/audio) comes along, picked as llama.cpp's -hf does.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from localrun.modelstore.pull import plan_pull, pull

    settings = settings_from(ctx)
    store = open_store(ctx)
    plan = plan_pull(
        ref,
        settings=settings,
        revision=revision,
        offline=offline,
        trust_remote_code=trust_remote_code,
        allow_native=allow_native,
        mmproj=not no_mmproj,
    )
    if not yes:
        for line in plan.describe():
            err_console().print(line, highlight=False)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err_console(), transient=False) as progress:
        record = pull(
            store,
            plan,
            offline=offline,
            progress=_Bars(progress),
            trust_remote_code=trust_remote_code,
            allow_native=allow_native,
        )
    from localrun.modelstore.capabilities import media

    caps = media(record)
    sees = f" · {' + '.join(caps)} (projector {plan.projector})" if caps else ""
    console().print(f"pulled [bold]{record.name}[/] · {human_bytes(record.size)} · verified{sees}", highlight=False)


@click.command("search")
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["gguf", "mlx", "mlc"]), help="Only repos in this format.")
@click.option("--limit", type=click.IntRange(1, 200), default=20)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def search_cmd(ctx, query, fmt, limit, as_json):
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


@click.command("verify")
@click.argument("names", nargs=-1)
@click.pass_context
def verify_cmd(ctx, names):
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


COMMANDS = [pull_cmd, search_cmd, verify_cmd]
