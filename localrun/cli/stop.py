"""``localrun stop``: unload a model from the running server (``ollama stop``, ``lms unload``)."""

from __future__ import annotations

import click

from localrun.cli.output import console, err_console, settings_from


@click.command("stop")
@click.argument("names", nargs=-1)
@click.option("--all", "stop_all", is_flag=True, help="Unload every model the server has loaded.")
@click.pass_context
def stop_cmd(ctx: click.Context, names: tuple[str, ...], stop_all: bool) -> None:
    """Unload NAMES from the running server, freeing their memory; the next request loads them again."""
    from localrun.cli.common import call_server
    from localrun.cli.ps import loaded_name
    from localrun.errors import InvalidName

    settings = settings_from(ctx)
    if stop_all:
        names = tuple(loaded_name(m) for m in call_server(settings, "GET", "/api/ps").get("models", []))
        if not names:
            err_console().print("no models loaded", highlight=False)
            return
    elif not names:
        raise InvalidName("name the model to stop", hint="`localrun ps` lists the loaded ones; --all stops them all")
    missing = []
    for name in names:
        answer = call_server(settings, "POST", "/admin/unload", {"model": name})
        if answer.get("unloaded"):
            console().print(f"stopped [bold]{answer['model']}[/]", highlight=False)
        else:
            missing.append(str(answer.get("model", name)))
    if missing:
        err_console().print(f"not loaded: {', '.join(missing)} (`localrun ps` lists the loaded ones)", highlight=False)
        ctx.exit(1)


COMMAND = stop_cmd
