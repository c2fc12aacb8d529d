"""Upstreams: other servers whose models localrun serves behind its own API.

An upstream is a named OpenAI-compatible server (vLLM, SGLang, TGI, TensorRT-LLM, LMDeploy,
llama-server, Ollama, another localrun, or anything else that speaks OpenAI's API). Its
configuration lives in ``config.toml`` as ``[[upstreams]]`` tables, read by the settings
like every other section and written by ``localrun upstream add|rm``.

This module holds the configuration (plain pydantic, no I/O at import) and the one place
that rewrites the ``[[upstreams]]`` tables of the config file. The routing and health
live in :mod:`localrun.upstreams.pool`, the HTTP side in :mod:`localrun.runtimes.openai_compat.upstream_client`.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

#: The kinds of server an upstream can be; each has its own adapter (health path, capabilities).
KINDS = ("vllm", "sglang", "tgi", "trtllm", "lmdeploy", "llama-server", "ollama", "localrun", "openai")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ROUTING_POLICIES = ("least-loaded", "prefix-affinity")


class UpstreamConfig(BaseModel):
    """One ``[[upstreams]]`` table of config.toml."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """How localrun names it: in errors, metrics, the TUI and ``NAME/MODEL`` model names."""
    url: str
    """Base URL of the server, without ``/v1`` (``http://10.0.0.5:8000``)."""
    kind: str = "openai"
    """Which engine it is: decides the health endpoint, capabilities and quirks."""
    key: SecretStr | None = None
    """API key sent as a Bearer token to this upstream only."""
    key_env: str | None = None
    """Name of an environment variable holding the key (preferred over a literal key)."""
    models: list[str] = Field(default_factory=list)
    """The models it serves; empty means: ask its ``/v1/models``."""
    max_concurrency: int = Field(64, ge=1, le=10_000)
    """Requests localrun sends it at once; more wait (within the model's queue)."""
    weight: float = Field(1.0, gt=0, le=1000)
    """Share of the load relative to the other upstreams of a model."""
    connect_timeout_s: float = Field(5.0, gt=0, le=600)
    """Time to open a connection."""
    first_byte_timeout_s: float = Field(120.0, gt=0, le=3600)
    """Time from sending a request to the first event of its answer (covers the prefill)."""
    chunk_timeout_s: float = Field(60.0, gt=0, le=3600)
    """Longest silence allowed between two events of a stream."""
    ca_bundle: str | None = None
    """A CA bundle (PEM) for this upstream's TLS certificate; default: upstream.ca_bundle, else the system's."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"upstream name {v!r} must be letters, digits, '-', '_' or '.' (no '/'), at most 63")
        return v

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in KINDS:
            raise ValueError(f"unknown upstream kind {v!r}; try one of: {', '.join(KINDS)}")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"upstream url {v!r} must start with http:// or https:// and name a host")
        if v.endswith("/v1"):
            v = v[:-3]
        return v

    @model_validator(mode="after")
    def _one_key(self) -> "UpstreamConfig":
        if self.key is not None and self.key_env:
            raise ValueError(f"upstream {self.name!r}: set either 'key' or 'key_env', not both")
        return self

    def api_key(self, env: dict[str, str] | None = None) -> str | None:
        """The key to send, read now (an env var may change between runs); None when there is none."""
        if self.key is not None:
            return self.key.get_secret_value() or None
        if self.key_env:
            return (os.environ if env is None else env).get(self.key_env) or None
        return None


class UpstreamSettings(BaseModel):
    """How localrun treats its upstreams as a whole (``[upstream]`` in config.toml)."""

    routing: str = "least-loaded"
    """``least-loaded`` (weighted least outstanding requests) or ``prefix-affinity`` (same
    upstream for prompts that share a long prefix, so its prefix cache hits)."""
    affinity_prefix_chars: int = Field(2048, ge=64, le=1_000_000)
    """How many leading characters of a prompt make its affinity key."""
    affinity_max_imbalance: int = Field(8, ge=0, le=10_000)
    """Prefix affinity yields to the least-loaded upstream when the sticky one has this many
    more requests in flight (and 1.5 times as many)."""
    probe_interval_s: float = Field(10.0, gt=0, le=3600)
    """Seconds between active health probes of each upstream."""
    refresh_models_s: float = Field(60.0, gt=0, le=86400)
    """Seconds between re-reads of an upstream's ``/v1/models`` (when its models are not listed)."""
    cooldown_s: float = Field(10.0, ge=0, le=3600)
    """How long a failing upstream gets no requests (unless it is the only one left)."""
    ca_bundle: str | None = None
    """A CA bundle (PEM) for upstreams' TLS certificates (intranet CAs); default: the system's."""

    @field_validator("routing")
    @classmethod
    def _routing(cls, v: str) -> str:
        if v not in ROUTING_POLICIES:
            raise ValueError(f"unknown routing policy {v!r}; try one of: {', '.join(ROUTING_POLICIES)}")
        return v


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
