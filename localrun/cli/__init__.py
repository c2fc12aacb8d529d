"""The ``localrun`` command line.

Subcommands live in small modules grouped by area; this module holds the group, the
shared options and the one place where a ``LocalrunError`` becomes a message and an exit
code. Heavy imports happen inside each command so ``localrun --help`` stays fast.
"""

from __future__ import annotations

import sys

import click

from localrun import __version__
from localrun.errors import LocalrunError


class LocalrunGroup(click.Group):
    """Turns every LocalrunError into one readable message and its exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except LocalrunError as exc:
            from localrun.cli.output import err_console

            err_console().print(f"[bold red]error:[/] {exc.message}", highlight=False)
            if exc.hint:
                err_console().print(f"  [dim]→ {exc.hint}[/]", highlight=False)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            sys.exit(130)


@click.group(cls=LocalrunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="localrun")
@click.option("--log-level", default=None, help="Logging level (DEBUG, INFO, WARNING…); default from settings.")
@click.pass_context
def main(ctx: click.Context, log_level: str | None) -> None:
    """Run language models on this machine: pull, plan, chat and serve them."""
    ctx.ensure_object(dict)
    ctx.obj["log_level"] = log_level


def _register() -> None:
    from localrun.cli import bundle as bundle_cmd
    from localrun.cli import cache as cache_cmd
    from localrun.cli import hub as hubcmds
    from localrun.cli import launch, machine, models
    from localrun.cli import mirror as mirror_cmd
    from localrun.cli import run as running
    from localrun.cli import tui as tui_cmd
    from localrun.cli import upstream as upstreamcmds

    for module in (models, hubcmds, running, machine, tui_cmd, launch, bundle_cmd, mirror_cmd, upstreamcmds, cache_cmd):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
