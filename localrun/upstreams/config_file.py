"""Upstreams: other servers whose models localrun serves behind its own API.

An upstream is a named OpenAI-compatible server (vLLM, SGLang, TGI, TensorRT-LLM, LMDeploy,
llama-server, Ollama, another localrun, or anything else that speaks OpenAI's API). Its
configuration lives in ``config.toml`` as ``[[upstreams]]`` tables, read by the settings
like every other section and written by ``localrun upstream add|rm``.

The configuration sections themselves (:class:`~localrun.settings.UpstreamConfig`,
:class:`~localrun.settings.UpstreamSettings`) live in the settings, the kernel, so settings
never reach up into this package; this module is the one place that reads and rewrites the
``[[upstreams]]`` tables of the config file. The routing and health live in
:mod:`localrun.upstreams.pool`, the HTTP side in :mod:`localrun.runtimes.openai_compat.client`.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from localrun.settings import UpstreamConfig

# --- the [[upstreams]] tables of config.toml -----------------------------------------------

_HEADER = re.compile(r"^\s*\[")
_UPSTREAM_HEADER = re.compile(r"^\s*\[\[\s*upstreams\s*\]\]")


def read_upstreams(path: Path) -> list[UpstreamConfig]:
    """The upstreams configured in ``path`` (none when the file does not exist)."""
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return [UpstreamConfig.model_validate(t) for t in data.get("upstreams", [])]


def _toml_value(value: Any) -> str:
    """A TOML literal for the simple values an upstream table holds (JSON strings are TOML strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def render_upstream(up: UpstreamConfig) -> str:
    """One ``[[upstreams]]`` table; defaults are left out, a literal key is written as given."""
    data = up.model_dump(exclude_defaults=True)
    data["name"], data["url"] = up.name, up.url
    if up.key is not None:
        data["key"] = up.key.get_secret_value()
    lines = ["[[upstreams]]"]
    for field in UpstreamConfig.model_fields:
        if field in data and data[field] is not None:
            lines.append(f"{field} = {_toml_value(data[field])}")
    return "\n".join(lines) + "\n"


def write_upstreams(path: Path, upstreams: list[UpstreamConfig]) -> None:
    """Replace every ``[[upstreams]]`` table of ``path`` with ``upstreams``, keeping the rest.

    Other tables, comments and keys are left as they are; the file is written to a
    temporary name and moved into place, and kept private (it may hold keys).
    """
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    kept: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        if _UPSTREAM_HEADER.match(line):
            inside = True
            continue
        if inside and _HEADER.match(line):
            inside = False
        if not inside:
            kept.append(line)
    body = "".join(kept).rstrip()
    blocks = "\n".join(render_upstream(u) for u in upstreams)
    out = (body + "\n\n" if body else "") + blocks
    tomllib.loads(out)  # never leave a file the settings cannot read
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(out)
    os.replace(tmp, path)
