"""``localrun mirror``: serve this machine's store to the intranet as a Hugging Face hub."""

from __future__ import annotations

from typing import Any

import click

from localrun.cli.common import open_store
from localrun.cli.output import err_console, settings_from
from localrun.cli.serverlog import quiet_option, show_requests


@click.command("mirror")
@click.option("--host", default=None, help="Interface to bind (default 127.0.0.1). Anything else needs --key.")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port (default 8740).")
@click.option(
    "--key",
    default=None,
    envvar="LOCALRUN_MIRROR_KEY",
    help="Bearer key clients must send (their HF_TOKEN); required off loopback. Env LOCALRUN_MIRROR_KEY.",
)
@click.option(
    "--upstream",
    default=None,
    metavar="URL",
    help="Pull-through: fetch what the store lacks from this hub (verified), keep it, then serve it.",
)
@click.option(
    "--allow-host",
    "allowed_hosts",
    multiple=True,
    help="Extra Host header names to accept (a DNS name of this machine).",
)
@quiet_option
@click.pass_context
def mirror_cmd(
    ctx: click.Context,
    host: str | None,
    port: int | None,
    key: str | None,
    upstream: str | None,
    allowed_hosts: tuple[str, ...],
    quiet: bool,
) -> None:
    """Serve the model store as a Hugging Face hub endpoint, read-only.

    On another machine: HF_ENDPOINT=http://HOST:PORT (and HF_TOKEN=KEY off loopback) makes
    huggingface_hub, `hf download`, llama.cpp's -hf and `localrun pull` fetch from here.
    Logs a line per request to stderr (--quiet: warnings only).
    """
    from localrun.server.mirror.routes import DEFAULT_MIRROR_PORT, create_mirror_app
    from localrun.server.serve import check_bind_policy, probe_port, uvicorn_server

    server: dict[str, Any] = {"host": host or "127.0.0.1", "port": DEFAULT_MIRROR_PORT if port is None else port}
    if key:
        server["api_key"] = key
    if allowed_hosts:
        server["allowed_hosts"] = list(allowed_hosts)
    settings = settings_from(ctx, server=server)
    show_requests(ctx, settings, quiet=quiet)
    check_bind_policy(settings)
    probe_port(settings.server.host, settings.server.port)
    store = open_store(ctx)
    up = None
    if upstream:
        from localrun.server.mirror.pull_through import Upstream

        up = Upstream(upstream, settings=settings)
    app = create_mirror_app(settings, store, upstream=up)

    def ready(url: str) -> None:
        repos = len(app.state.mirror.repos())
        extra = f" · pull-through from {upstream}" if upstream else ""
        err_console().print(
            f"localrun mirror on [bold]{url}[/] · {repos} repos · key {'on' if key else 'off'}{extra} · "
            f"clients: HF_ENDPOINT={url} · Ctrl-C stops",
            highlight=False,
        )

    uvicorn_server(app, settings.server.host, settings.server.port, ready_callback=ready).run()


COMMAND = mirror_cmd
