"""``localrun pull``: download a model from the hub (or a mirror), verified and resumable."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from localrun.cli.common import open_store
from localrun.cli.output import console, err_console, human_bytes, settings_from

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from localrun.modelstore.download import Progress as FileProgress


class _Bars:
    """Per-file rich progress bars with speed and ETA, fed by the downloader's callback."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, TaskID] = {}
        #: Each file's bytes on disk and its size, as last reported: what an interrupted pull keeps.
        self.sizes: dict[str, tuple[int, int]] = {}

    def kept(self) -> str:
        done = sum(d for d, _ in self.sizes.values())
        total = sum(t for _, t in self.sizes.values())
        return f"{human_bytes(done)} of {human_bytes(total)}" if total else human_bytes(done)

    def __call__(self, p: FileProgress) -> None:
        self.sizes[p.file] = (p.done, p.total or 0)
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
def pull_cmd(
    ctx: click.Context,
    ref: str,
    revision: str | None,
    offline: bool,
    trust_remote_code: bool,
    allow_native: bool,
    no_mmproj: bool,
    yes: bool,
) -> None:
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
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    bars = None
    try:
        with Progress(*columns, console=err_console(), transient=False) as progress:
            bars = _Bars(progress)
            record = pull(
                store,
                plan,
                offline=offline,
                progress=bars,
                trust_remote_code=trust_remote_code,
                allow_native=allow_native,
            )
    except KeyboardInterrupt:
        kept = bars.kept() if bars is not None else "nothing"
        err_console().print(
            f"interrupted: {kept} downloaded is kept; `localrun pull {ref}` again resumes from there",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        raise
    from localrun.modelstore.capabilities import media

    caps = media(record)
    sees = f" · {' + '.join(caps)} (projector {plan.projector})" if caps else ""
    console().print(f"pulled [bold]{record.name}[/] · {human_bytes(record.size)} · verified{sees}", highlight=False)


COMMAND = pull_cmd
