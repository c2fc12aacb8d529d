"""``localrun ps``: the models the running server has loaded."""

from __future__ import annotations

from typing import Any

import click

from localrun.cli.output import Column, human_bytes, print_rows, settings_from


@click.command("ps")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def ps_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show the models the running server has loaded."""

    import httpx

    from localrun.errors import RuntimeUnavailable
    from localrun.tui.format import cache_cell

    settings = settings_from(ctx)
    host = "127.0.0.1" if settings.server.host in ("0.0.0.0", "::") else settings.server.host
    url = f"http://{host}:{settings.server.port}/api/ps"
    headers: dict[str, str] = {}
    if settings.server.api_key:
        headers["Authorization"] = f"Bearer {settings.server.api_key.get_secret_value()}"
    try:
        data = httpx.get(url, headers=headers, timeout=3).raise_for_status().json()
    except httpx.HTTPError as exc:
        raise RuntimeUnavailable(
            f"no localrun server answered at {url}: {exc}", hint="start one with `localrun serve`"
        ) from exc

    def ttl(m: dict[str, Any]) -> str:
        left = m.get("localrun", {}).get("ttl_left_s")
        return "pinned" if left is None else f"{left:.0f} s"

    columns = [
        Column("Name", lambda m: m.get("name", "?")),
        Column("Runtime", lambda m: m.get("localrun", {}).get("runtime", "?")),
        Column("Device", lambda m: m.get("localrun", {}).get("device", "?")),
        Column("Memory", lambda m: human_bytes(m.get("size_vram") or m.get("size"))),
        Column("Idle", lambda m: f"{m.get('localrun', {}).get('idle_s', 0):.0f} s"),
        Column("Until unload", ttl),
        Column("Cache RAM", lambda m: cache_cell(m.get("localrun", {}).get("cache"), "ram")),
        Column("Cache disk", lambda m: cache_cell(m.get("localrun", {}).get("cache"), "disk")),
    ]
    print_rows(data.get("models", []), columns, as_json=as_json, empty="no models loaded")


COMMAND = ps_cmd
