"""Not a command: what ``serve`` and ``mirror`` show while they run.

At the default level they log, as llama-server and Ollama do, one line per request (method, path,
status, time, the model and its tokens, a refusal's reason) and every load, unload, eviction and
refusal: a user sees what a client sent and why it was turned away. ``--quiet`` keeps them to
warnings; an explicit ``--log-level`` (or ``log_level`` in the settings) decides by itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import click

from localrun.settings import Settings

F = TypeVar("F", bound=Callable[..., object])

#: The loggers whose INFO lines a running server shows: requests, the manager's loads and unloads,
#: the activity log (a request's prefill and rate, refusals), the mirror's pull-through fetches.
SERVER_LOGGERS = (
    "localrun.server.access",
    "localrun.activity",
    "localrun.manager",
    "localrun.residency",
    "localrun.server.mirror",
)


def quiet_option(f: F) -> F:
    return click.option(
        "--quiet", "-q", is_flag=True, help="Log warnings only, not a line per request, load and unload."
    )(f)


def show_requests(ctx: click.Context, settings: Settings, *, quiet: bool) -> None:
    """Turn on the per-request and load lines unless ``quiet`` or a level was chosen."""
    chosen = ctx.find_root().obj.get("log_level") or (settings.log_level.upper() != "WARNING")
    if quiet or chosen:
        return
    for name in SERVER_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
