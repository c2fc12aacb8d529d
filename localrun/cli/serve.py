"""``localrun serve``: serve the store's models over the OpenAI-, Ollama- and Anthropic-compatible APIs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from localrun.cli.common import open_store, overrides_from, speculative_option
from localrun.cli.loading import ensure_builtins_visibly
from localrun.cli.output import ctx_option, err_console, placement_options, settings_from
from localrun.cli.serverlog import quiet_option, show_requests


def pooling_settings(items: Iterable[str]) -> dict[str, dict[str, str]]:
    """``--pooling`` values as ``Settings.models`` entries: ``KIND`` for every model ("*"), ``MODEL=KIND`` for one."""
    from localrun.planning.overrides import check_pooling

    out: dict[str, dict[str, str]] = {}
    for item in items:
        model, _, kind = item.rpartition("=")
        out.setdefault(model or "*", {})["pooling"] = check_pooling(kind)
    return out


@click.command("serve")
@click.option("--host", default=None, help="Interface to bind (default 127.0.0.1). Non-loopback needs --api-key.")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (default 8739).")
@click.option(
    "--api-key", default=None, envvar="LOCALRUN_API_KEY", help="Require this Bearer key (env LOCALRUN_API_KEY)."
)
@click.option("--runtime", default=None, help="Force one runtime for every model.")
@ctx_option(
    'Context every model is loaded with (beats [models."NAME"] ctx and runtime.ctx; default: the trained '
    "context within the memory tier, see `localrun plan`)."
)
@click.option(
    "--parallel",
    type=click.IntRange(1, 64),
    default=None,
    help="Requests each llama.cpp model decodes at once (default: up to 4 when they fit).",
)
@click.option("--no-default-model", is_flag=True, help="Do not assemble and register the embedded default model.")
@click.option(
    "--pooling",
    "poolings",
    multiple=True,
    metavar="[MODEL=]KIND",
    help="Embedding pooling (mean, cls, last, none, rank) for MODEL, or every model; repeatable.",
)
@click.option(
    "--mirror", is_flag=True, help="Also serve the store as a Hugging Face hub mirror (HF_ENDPOINT=this URL)."
)
@click.option(
    "--slot-save-path",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder of llama-server's slot files (POST /slots/ID?action=save|restore); default <cache dir>/slots.",
)
@speculative_option
@placement_options(gpu_layers=True)
@quiet_option
@click.pass_context
def serve_cmd(
    ctx: click.Context,
    host: str | None,
    port: int | None,
    api_key: str | None,
    runtime: str | None,
    ctx_len: int | None,
    parallel: int | None,
    no_default_model: bool,
    poolings: tuple[str, ...],
    mirror: bool,
    slot_save_path: Path | None,
    speculative: str | None,
    draft: str | None,
    quiet: bool,
) -> None:
    """Serve loaded models over OpenAI- and Ollama-compatible HTTP APIs.

    Logs a line per request, load and unload to stderr (--quiet: warnings only)."""
    server = {
        k: v
        for k, v in {
            "host": host,
            "port": port,
            "api_key": api_key,
            "mirror": mirror or None,
            "slot_save_path": slot_save_path,
        }.items()
        if v is not None
    }
    overrides: dict[str, Any] = {"server": server} if server else {}
    if poolings:
        overrides["models"] = pooling_settings(poolings)
    runtime_settings = {
        k: v
        for k, v in {
            "force": runtime or None,
            "parallel": parallel,
            "speculative": speculative and speculative.lower(),
            "draft": draft,
        }.items()
        if v is not None
    }
    if runtime_settings:
        overrides["runtime"] = runtime_settings
    settings = settings_from(ctx, **overrides)
    show_requests(ctx, settings, quiet=quiet)
    store = open_store(ctx)
    if not no_default_model:
        ensure_builtins_visibly(store)
    from localrun.manager import ModelManager
    from localrun.server.serve import run_server

    manager = ModelManager(settings, store, overrides=overrides_from(None, ctx_len, None, None, None))
    key = "on" if settings.server.api_key else "off"

    def ready(url: str) -> None:
        err_console().print(
            f"localrun serving on [bold]{url}[/] · API key {key} · {len(store.list())} models · Ctrl-C stops",
            highlight=False,
        )
        if settings.server.mirror:
            err_console().print(f"hub mirror on the same port: HF_ENDPOINT={url}", highlight=False)

    try:
        run_server(settings, manager, ready_callback=ready)
    finally:
        manager.shutdown()


COMMAND = serve_cmd
