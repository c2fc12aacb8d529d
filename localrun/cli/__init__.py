"""The ``localrun`` command line.

Each command lives in the module of its name (``run.py`` is ``localrun run``, ``upstream.py`` the
``localrun upstream`` group); this module holds the group, finds the commands by looping over its
modules, and is the one place where a ``LocalrunError`` becomes a message and an exit code.
Heavy imports happen inside each command so ``localrun --help`` stays fast.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

import click

from localrun import __version__
from localrun.errors import LocalrunError


class LocalrunGroup(click.Group):
    """Turns every LocalrunError into one readable message and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
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
    """One rule, the file is the command: every module here that defines ``COMMAND`` is the command of
    its name (``import_.py`` is ``import``: a keyword); the others (output, common) are what they share."""
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "COMMAND"):
            main.add_command(module.COMMAND)


_register()
