"""``localrun tui``: the terminal UI, serving what it loads on the same port as ``serve``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from localrun.settings import Settings


def _log_to_file(settings: Settings, level: str) -> Path:
    """The screen belongs to the TUI: logs go to a file, never to the terminal."""
    path = settings.data_dir / "logs" / "tui.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return path


@click.command("tui")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=None, help="Port to serve on (default 8739, or server.port)."
)
@click.option("--no-serve", is_flag=True, help="Do not serve: manage models without exposing them to local apps.")
@click.option("--runtime", default=None, help="Force one runtime for every model (e.g. fake for a demo).")
@click.option("--no-default-model", is_flag=True, help="Do not register the embedded default model.")
@click.pass_context
def tui_cmd(ctx: click.Context, port: int | None, no_serve: bool, runtime: str | None, no_default_model: bool) -> None:
    """Open the terminal UI: library, discover and pull, hardware, server and chat.

    It serves the models it loads on localhost (like `localrun serve`); if another
    localrun already serves the port, it manages that one instead.
    """
    from localrun.settings import load_settings

    overrides: dict[str, Any] = {}
    if port is not None:
        overrides["server"] = {"port": port}
    if runtime:
        overrides["runtime"] = {"force": runtime}
    obj = ctx.find_root().obj
    settings = load_settings(**overrides)
    obj["settings"] = settings
    log_path = _log_to_file(settings, obj.get("log_level") or settings.log_level)

    from localrun.tui.factory import close_app, make_app

    app = make_app(settings, serve=not no_serve, log_path=str(log_path), default_model=not no_default_model)
    try:
        app.run()
    finally:
        close_app(app)


COMMAND = tui_cmd
