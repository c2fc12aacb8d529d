"""``localrun upstream add|ls|rm|check``: the servers whose models localrun also serves.

They are kept as ``[[upstreams]]`` tables in config.toml (see localrun/upstreams.py); a key
is best given as the name of an environment variable (``--key-env``), so the file holds no
secret. ``check`` probes an upstream the way the server will: its kind's health endpoint,
its model list, its version where it tells one, and whatever would not work.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localrun.cli.output import Column, console, err_console, print_rows, settings_from
from localrun.settings import UPSTREAM_KINDS

if TYPE_CHECKING:
    from localrun.settings import UpstreamConfig


def _config_path() -> Path:
    from localrun.settings import default_config_file

    return default_config_file()


def _configured() -> tuple[Path, list[UpstreamConfig]]:
    from localrun.errors import ConfigError
    from localrun.upstreams.config_file import read_upstreams

    path = _config_path()
    try:
        return path, read_upstreams(path)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"cannot read the upstreams in {path}: {exc}", hint="fix the [[upstreams]] tables") from exc


@click.group("upstream")
def upstream_group() -> None:
    """Serve models of other servers (vLLM, SGLang, TGI, Ollama, another localrun…) through localrun."""


@upstream_group.command("add")
@click.argument("name")
@click.argument("url")
@click.option(
    "--kind", type=click.Choice(UPSTREAM_KINDS), default="openai", show_default=True, help="Which engine it is."
)
@click.option("--key-env", help="Environment variable that holds its API key (kept out of config.toml).")
@click.option("--key", help="Its API key, written to config.toml (prefer --key-env).")
@click.option("--model", "models", multiple=True, help="A model it serves (repeat); default: ask its /v1/models.")
@click.option("--max-concurrency", type=int, default=None, help="Requests sent to it at once (default 64).")
@click.option("--weight", type=float, default=None, help="Its share of the load against other upstreams (default 1).")
@click.option("--connect-timeout", type=float, default=None, help="Seconds to connect (default 5).")
@click.option(
    "--first-byte-timeout", type=float, default=None, help="Seconds to the first event of an answer (default 120)."
)
@click.option(
    "--chunk-timeout", type=float, default=None, help="Longest silence within a stream, seconds (default 60)."
)
@click.option("--ca-bundle", help="A CA bundle (PEM) for its TLS certificate.")
@click.option("--replace", is_flag=True, help="Replace an upstream of the same name.")
@click.option("--no-check", is_flag=True, help="Do not probe it before saving.")
@click.pass_context
def add_cmd(
    ctx: click.Context,
    name: str,
    url: str,
    kind: str,
    key_env: str | None,
    key: str | None,
    models: tuple[str, ...],
    max_concurrency: int | None,
    weight: float | None,
    connect_timeout: float | None,
    first_byte_timeout: float | None,
    chunk_timeout: float | None,
    ca_bundle: str | None,
    replace: bool,
    no_check: bool,
) -> None:
    """Add upstream NAME at URL (e.g. http://10.0.0.5:8000) to config.toml."""
    from pydantic import ValidationError

    from localrun.errors import ConfigError, ModelExists
    from localrun.settings import UpstreamConfig
    from localrun.upstreams.config_file import write_upstreams

    settings_from(ctx)
    fields = {
        "name": name,
        "url": url,
        "kind": kind,
        "key_env": key_env,
        "key": key,
        "models": list(models) or None,
        "max_concurrency": max_concurrency,
        "weight": weight,
        "connect_timeout_s": connect_timeout,
        "first_byte_timeout_s": first_byte_timeout,
        "chunk_timeout_s": chunk_timeout,
        "ca_bundle": ca_bundle,
    }
    try:
        up = UpstreamConfig(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(
            f"invalid upstream: {exc.errors()[0]['msg']}", hint="see `localrun upstream add --help`"
        ) from None
    path, current = _configured()
    if any(u.name == name for u in current) and not replace:
        raise ModelExists(
            f"an upstream named {name!r} is already configured", hint="pass --replace, or pick another name"
        )
    if not no_check:
        report = _check(up)
        _print_check(report)
        if not report["ok"]:
            err_console().print("[yellow]saved anyway[/]: the server will keep probing it", highlight=False)
    write_upstreams(path, [u for u in current if u.name != name] + [up])
    console().print(f"added upstream [bold]{name}[/] ({kind}) at {up.url} to {path}", highlight=False)


@upstream_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def ls_cmd(ctx: click.Context, as_json: bool) -> None:
    """List the configured upstreams."""
    settings_from(ctx)
    _, current = _configured()
    rows = [
        {
            "name": u.name,
            "url": u.url,
            "kind": u.kind,
            "key": "env " + u.key_env if u.key_env else ("set" if u.key else "none"),
            "models": u.models or "discovered",
            "max_concurrency": u.max_concurrency,
            "weight": u.weight,
        }
        for u in current
    ]
    columns = [
        Column("Name", lambda r: r["name"]),
        Column("Kind", lambda r: r["kind"]),
        Column("URL", lambda r: r["url"]),
        Column("Key", lambda r: r["key"]),
        Column("Models", lambda r: ", ".join(r["models"]) if isinstance(r["models"], list) else r["models"]),
        Column("Max conc.", lambda r: str(r["max_concurrency"])),
        Column("Weight", lambda r: f"{r['weight']:g}"),
    ]
    print_rows(rows, columns, as_json=as_json, empty="no upstreams — `localrun upstream add NAME URL --kind vllm`")


@upstream_group.command("rm")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def rm_cmd(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Remove upstreams from config.toml."""
    from localrun.errors import ModelNotFound
    from localrun.upstreams.config_file import write_upstreams

    settings_from(ctx)
    path, current = _configured()
    known = {u.name for u in current}
    missing = [n for n in names if n not in known]
    if missing:
        raise ModelNotFound(
            f"no upstream named {missing[0]!r}", hint="configured: " + (", ".join(sorted(known)) or "none")
        )
    write_upstreams(path, [u for u in current if u.name not in names])
    for name in names:
        console().print(f"removed upstream [bold]{name}[/]", highlight=False)


@upstream_group.command("check")
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def check_cmd(ctx: click.Context, names: tuple[str, ...], as_json: bool) -> None:
    """Probe upstreams (all, or NAMES): health, models, version, latency, incompatibilities."""
    from localrun.errors import ModelNotFound

    settings_from(ctx)
    _, current = _configured()
    chosen = [u for u in current if not names or u.name in names]
    missing = set(names) - {u.name for u in chosen}
    if missing:
        raise ModelNotFound(
            f"no upstream named {sorted(missing)[0]!r}",
            hint="configured: " + (", ".join(u.name for u in current) or "none"),
        )
    reports = [_check(u) for u in chosen]
    if as_json:
        click.echo(json.dumps(reports, indent=2))
    else:
        for report in reports:
            _print_check(report)
    if any(not r["ok"] for r in reports):
        ctx.exit(11)


def _check(up: UpstreamConfig) -> dict[str, Any]:
    """What the server would find: probe, models, version, and the problems in words."""
    from localrun.errors import LocalrunError
    from localrun.runtimes.openai_compat.kinds import get_kind
    from localrun.settings import UpstreamSettings
    from localrun.upstreams.pool import make_client

    client = make_client(up, UpstreamSettings())
    kind = get_kind(up.kind)  # the client's own kind (make_client)
    problems: list[str] = []
    try:
        probe = client.probe(timeout_s=up.connect_timeout_s + 5)
        if not probe.ok:
            problems.append(f"health check {kind.health_path} failed: {probe.detail}")
        models: list[str] = []
        t0 = time.monotonic()
        try:
            rows = client.models(timeout_s=up.connect_timeout_s + 10)
            models = [r["id"] for r in rows]
        except LocalrunError as exc:
            problems.append(f"/v1/models failed: {exc.message}")
        listed = time.monotonic() - t0
        missing = [m for m in up.models if models and m not in models]
        if missing:
            problems.append(f"configured models it does not list: {', '.join(missing)}")
        if kind.single_model and len(models) > 1:
            problems.append(f"a {up.kind} server serves one model, but it lists {len(models)}")
        if up.key_env and up.api_key() is None:
            problems.append(f"environment variable {up.key_env} is not set: no key will be sent")
        version = client.version() if probe.ok else None
    finally:
        client.close()
    return {
        "name": up.name,
        "url": up.url,
        "kind": up.kind,
        "ok": probe.ok and not problems,
        "version": version,
        "latency_ms": round(probe.latency_s * 1000, 1),
        "models_ms": round(listed * 1000, 1),
        "models": up.models or models,
        "problems": problems,
    }


def _print_check(r: dict[str, Any]) -> None:
    mark = "[green]ok[/]" if r["ok"] else "[red]problem[/]"
    version = f" · version {r['version']}" if r["version"] else ""
    console().print(
        f"[bold]{r['name']}[/] ({r['kind']}) {r['url']}: {mark} · {r['latency_ms']} ms{version}", highlight=False
    )
    console().print("  serves: " + (", ".join(r["models"]) or "nothing listed"), highlight=False)
    for p in r["problems"]:
        console().print(f"  [yellow]![/] {p}", highlight=False)


COMMAND = upstream_group
