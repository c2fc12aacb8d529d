"""Settings: one pydantic-settings class, layered.

Precedence, highest first: explicit keyword arguments (the CLI's flags), ``LOCALRUN_*``
environment variables (nested with ``__``, e.g. ``LOCALRUN_SERVER__PORT=9000``), the TOML
config file (``$LOCALRUN_CONFIG`` or ``<config dir>/config.toml``), then defaults. Paths
come from platformdirs unless ``LOCALRUN_HOME`` puts everything under one folder (tests
and portable installs use that). Nothing is read or written at import time.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from localrun.types import MAX_IMAGE_PIXELS

if TYPE_CHECKING:
    from platformdirs import PlatformDirs

APP_NAME = "localrun"
#: Not 11434 (Ollama), 1234 (LM Studio), 8080 (llama-server, mlx_lm, llamafile) or 8000 (mlc, llama_cpp.server).
DEFAULT_PORT = 8739
#: The shortest API key accepted. The key is the only lock on a server reachable from the network
#: and nothing limits how fast a client may try keys, so a 1–3 character key falls to a few hundred
#: thousand requests; 8 is the floor NIST SP 800-63B sets for a secret a person chooses.
MIN_API_KEY_LENGTH = 8


def _dirs() -> PlatformDirs:
    from platformdirs import PlatformDirs

    return PlatformDirs(APP_NAME, appauthor=False)


def _home() -> Path | None:
    home = os.environ.get("LOCALRUN_HOME")
    return Path(home).expanduser() if home else None


def default_data_dir() -> Path:
    home = _home()
    return home / "data" if home else Path(_dirs().user_data_dir)


def default_cache_dir() -> Path:
    home = _home()
    return home / "cache" if home else Path(_dirs().user_cache_dir)


def default_config_file() -> Path:
    explicit = os.environ.get("LOCALRUN_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    home = _home()
    return (home / "config.toml") if home else Path(_dirs().user_config_dir) / "config.toml"


class ServerSettings(BaseModel):
    """The embedded OpenAI/Ollama-compatible server."""

    host: str = "127.0.0.1"
    """Interface to bind. Anything but loopback requires an API key."""
    port: int = Field(DEFAULT_PORT, ge=1, le=65535)
    """TCP port; localrun's own, so it never fights Ollama, LM Studio or llama-server."""
    api_key: SecretStr | None = None
    """Bearer key clients must send. Also read from LOCALRUN_API_KEY."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Extra Host header names accepted besides localhost, 127.0.0.1 and [::1] (DNS-rebinding guard)."""
    cors_origins: list[str] = Field(default_factory=list)
    """Origins allowed by CORS besides the local ones (see ``cors_local_origins``)."""
    cors_local_origins: bool = True
    """Let browser pages served from this machine (http(s)://localhost, 127.0.0.1 or [::1], any
    port) and desktop app shells (app://, tauri://, vscode-webview://, vscode-file://, file://)
    call the API, as Ollama does by default; false: only ``cors_origins``."""
    max_body_bytes: int = Field(48 * 1024 * 1024, ge=1024)
    """Largest request body accepted. 48 MiB takes a request holding ``max_media_total_bytes`` of
    images inline (32 MiB of files are ~43 MiB in base64) plus its text: a phone photo (3–8 MB)
    alone is 4–11 MB in base64, which the old 4 MiB refused."""
    max_upload_bytes: int = Field(1024**4, ge=1024)
    """Largest blob an Ollama client may upload (``POST /api/blobs``, streamed to disk, never held
    in memory); the disk's free space bounds it too. 1 TiB: any model file."""
    max_media_bytes: int = Field(20 * 1024 * 1024, ge=1024)
    """Largest image or audio clip accepted, decoded (inline or fetched). 20 MiB: OpenAI's cap per
    image; it takes a 48-MP phone JPEG or minutes of WAV, and refuses a raw camera dump."""
    max_media_total_bytes: int = Field(32 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    """Largest sum of one request's media, decoded. The worker pipe carries them raw, as one
    frame's payloads of at most 64 MiB (localrun/frames.py), hence the ceiling of 64 MiB."""
    max_media_per_request: int = Field(32, ge=0, le=1000)
    """Most images and clips in one request, the conversation's history included (0 refuses any).
    32: an agent's history of screenshots fits, and at ~256 tokens an image it already fills an 8k context."""
    max_image_pixels: int = Field(MAX_IMAGE_PIXELS, ge=1, le=MAX_IMAGE_PIXELS)
    """Most pixels (width × height, read from the header before any decode) an image may have.
    64 MP takes a 48-MP phone photo; a 1 KB file claiming 60000×60000 is refused at the door. At
    most the runtime decoder's own cap (localrun.types.MAX_IMAGE_PIXELS), so the two agree."""
    fetch_image_urls: list[str] = Field(default_factory=list)
    """Hosts whose ``http(s)://`` image URLs the server fetches (names, or patterns such as
    ``*.example.com``). Empty (the default): none, since a server that fetches any URL it is sent
    lets any client reach what the server can (an SSRF hole); clients send images inline instead."""
    fetch_timeout_s: float = Field(10.0, gt=0, le=300)
    """Deadline for fetching one image URL, redirects included (llama-server's is 10 s too)."""
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    """Deadline for a request's head (request line and headers), from the connection's start
    or the request's first byte; a client still sending it then gets a 408 and is disconnected."""
    body_timeout_s: float = Field(60.0, gt=0, le=3600)
    """Deadline for reading a whole request body once its headers are in (a slow or endless
    chunked body gets a 408 and the connection is closed)."""
    keep_alive_timeout_s: float = Field(5.0, gt=0, le=3600)
    """How long an idle kept-alive connection waits for its next request (uvicorn's timeout_keep_alive)."""
    queue_size: int = Field(16, ge=1, le=10_000)
    """Requests that may wait per model before new ones get 503 + Retry-After."""
    strict_fields: bool = False
    """Refuse request fields localrun does not know (OpenAI's rule) instead of ignoring them and
    naming them in X-Localrun-Ignored-Fields."""
    reasoning_field: Literal["both", "reasoning_content", "reasoning"] = "both"
    """Where OpenAI chat answers carry a reasoning model's thinking: ``reasoning_content``
    (DeepSeek, llama.cpp), ``reasoning`` (gpt-oss, vLLM, Ollama) or both (clients read either)."""
    mirror: bool = False
    """Also serve the model store as a Hugging Face hub mirror on the same port (`serve --mirror`)."""
    docs: bool = False
    """Serve the Swagger UI at ``/docs`` (``/openapi.json`` is always served, behind the API key when one
    is set). Off by default: the page loads its scripts from a CDN, which a local server should not ask of
    a browser unless the user wants it."""
    web: bool = True
    """Serve the web app at ``/`` (chat, models, downloads; its files ship in the package, nothing from
    another origin). The page loads without the key; every API call it makes needs it. False: ``/`` answers
    a plain "localrun is running"."""
    slot_save_path: Path | None = None
    """The folder llama-server's slot API (``POST /slots/{id}?action=save|restore``) reads and
    writes; a ``filename`` is a plain name inside it. Unset: ``<cache_dir>/slots``."""
    # Refused requests and unauthenticated connections (server/connections.py).
    refused_body_timeout_s: float = Field(5.0, gt=0, le=3600)
    """How long the body of a refused request (401, 403, 413, 415, a preflight) is read and dropped
    so the connection can be kept; past it the refusal is sent with ``Connection: close``."""
    refused_body_max_bytes: int = Field(1024 * 1024, ge=0)
    """The most of a refused request's body that is read and dropped; a larger one closes the connection."""
    max_choices: int = Field(16, ge=1, le=128)
    """Most choices one request may ask for (OpenAI's ``n``, ``best_of``): each is a whole generation
    on the model, so ``n=128`` held it for a minute even at ``max_tokens`` 4 (llama-server refuses any n but 1)."""
    max_unauthenticated_connections: int = Field(32, ge=1, le=100_000)
    """With an API key: connections one address may hold before any of its requests has carried the key
    (one more gets a 429 and is closed). An address that has shown the key is not capped."""

    @field_validator("api_key")
    @classmethod
    def _usable_key(cls, key: SecretStr | None) -> SecretStr | None:
        """A key a client can send and no one guesses in a few tries (see MIN_API_KEY_LENGTH)."""
        if key is None:
            return None
        value = key.get_secret_value()
        if not value.strip():
            raise ValueError("the API key is blank: no client could send it; set a real key or none")
        if value != value.strip() or not all(0x21 <= ord(c) <= 0x7E or c == " " for c in value):
            raise ValueError(
                "the API key must be printable ASCII without leading or trailing spaces (an HTTP header carries it)"
            )
        if len(value) < MIN_API_KEY_LENGTH:
            raise ValueError(
                f"the API key is {len(value)} characters; use at least {MIN_API_KEY_LENGTH} "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`)"
            )
        return key


class RuntimeSettings(BaseModel):
    """How models are loaded and run."""

    threads: int | None = Field(None, ge=1, le=1024)
    """CPU threads for llama.cpp; default: the number of physical cores."""
    ctx: int | None = Field(None, ge=64)
    """Context every model is loaded with (``LOCALRUN_RUNTIME__CTX``, ``[runtime] ctx``); a model's own
    ``[models."NAME"] ctx`` and ``--ctx`` win over it. Unset: the planner's default (the trained context
    within a memory tier, see localrun/planning/context.py)."""
    context_length: int | None = Field(None, ge=64)
    """Cap on the context the planner picks on its own; default: no cap beyond the memory tier."""
    max_context_default: int | None = Field(None, ge=64)
    """Largest context the planner picks on its own when the model's trained length is bigger;
    unset: the memory tier (4k, 32k or 256k, as Ollama's VRAM tiers)."""
    parallel: int | None = Field(None, ge=1, le=64)
    """Requests one llama.cpp model decodes at once (slots, each with the whole context);
    default: up to 4 when their KV cache fits comfortably, else fewer."""
    speculative: Literal["auto", "off", "ngram", "draft"] | None = None
    """Speculative decoding in the llama.cpp runtime: "auto" drafts from the prompt and the
    answer itself (n-gram lookup), and from the draft model if there is one, only while it
    pays; "ngram" at every match; "draft" with the draft model at every step; "off" never.
    Unset: "auto"."""
    draft: str | None = None
    """The draft model for speculative decoding: a model in the store or a .gguf path;
    "none" for no draft model. Unset: a GGUF whose file name contains "draft" in the
    model's folder (a repo's sibling draft, as llama.cpp finds sidecars), if there is one."""
    max_tokens_cap: int = Field(8192, ge=1)
    """Upper bound on max_tokens for any request."""
    completion_max_tokens: int = Field(256, ge=1)
    """The answer's length when a request names none and the model has no chat template (a base
    model in completion mode, which never says it is done): about two paragraphs, seconds on a CPU.
    A chat model's answer ends by itself and is bounded only by ``max_tokens_cap``."""
    force_temperature: float | None = Field(None, ge=0, le=5)
    """Every request samples at this temperature, whatever it asks; 0 is greedy, the same answer
    every time. For reproducible runs (tests, evals) and for clients that hard-code their own
    (Claude Code sends 1). Unset: each request's own temperature."""
    template_timeout_s: float = Field(2.0, gt=0, le=60)
    """Time budget for rendering one chat template."""
    tool_fallback: Literal["call_or_reply", "tagged"] = "tagged"
    """How llama.cpp offers tools to a model whose chat template has no tool syntax of its own:
    "tagged" lets it answer freely and holds a call to its schema once it writes ``<tool_call>``;
    "call_or_reply" holds the whole answer to one JSON object, a call or a reply, as llama-server
    does: small models call far more often, also where no tool fits (Codex's "Say hello." got
    three calls from SmolLM2). Runtimes without grammars always use the tags."""
    max_loaded_models: int = Field(3, ge=1, le=64)
    """How many models may be loaded at once."""
    keep_alive_s: float = Field(300.0)
    """Idle time after which a model is unloaded; negative keeps it forever."""
    force: str | None = None
    """Run every model with this runtime (e.g. "fake" for tests, "ollama"); the planner still checks it can."""


class HubSettings(BaseModel):
    """Where models are pulled from."""

    endpoint: str | None = None
    """Hub base URL (a mirror); default: HF_ENDPOINT or huggingface.co."""
    offline: bool = False
    """Use local files only (also HF_HUB_OFFLINE=1)."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Seconds to open a connection to the hub or mirror before giving up on it."""
    first_byte_timeout_s: float = Field(30.0, gt=0)
    """Seconds a hub request waits for the answer's headers: an endpoint that accepts and stays silent fails here."""
    stall_timeout_s: float = Field(60.0, gt=0)
    """Seconds a download may go without a byte before it is cut (and resumed from what arrived)."""
    listing_timeout_s: float = Field(300.0, gt=0)
    """Seconds one listing or search page may take in all: a hub that drip-feeds a byte just inside
    the stall deadline is cut here."""
    min_download_rate: int = Field(1024, ge=0)
    """Bytes/s a file download must average over each ``download_rate_window_s`` (0: no floor), or it is
    cut and its bytes kept for the next pull: a hub drip-feeding inside the stall deadline ends here."""
    download_rate_window_s: float = Field(120.0, gt=0)
    """The seconds ``min_download_rate`` is averaged over."""


class ModelSettings(BaseModel):
    """Per-model overrides (``[models."NAME"]`` in config.toml; ``[models."*"]`` for every model)."""

    pooling: Literal["mean", "cls", "last", "none", "rank"] | None = None
    """How embeddings pool the token vectors; lets a generative model (Gemma) serve /v1/embeddings."""
    chat_template_file: Path | None = None
    """A Jinja chat template to use instead of the GGUF's (rendered in the same sandbox)."""
    ctx: int | None = Field(None, ge=64)
    """Context to load this model with; wins over runtime.ctx, loses to ``--ctx``."""


# --- upstreams: the [upstream] and [[upstreams]] sections ---------------------------------

#: The kinds of server an upstream can be: the one list of names. Each has its dialect (health
#: path, capabilities) in :mod:`localrun.runtimes.openai_compat.kinds`, whose table must agree.
UPSTREAM_KINDS = ("vllm", "sglang", "tgi", "trtllm", "lmdeploy", "llama-server", "ollama", "localrun", "openai")
UPSTREAM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
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
        if not UPSTREAM_NAME_RE.match(v):
            raise ValueError(f"upstream name {v!r} must be letters, digits, '-', '_' or '.' (no '/'), at most 63")
        return v

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in UPSTREAM_KINDS:
            raise ValueError(f"unknown upstream kind {v!r}; try one of: {', '.join(UPSTREAM_KINDS)}")
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
    def _one_key(self) -> UpstreamConfig:
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


#: The most host RAM the prompt cache's RAM tier takes when ``cache.kv_ram_bytes`` is unset.
KV_RAM_DEFAULT_MAX = 4 * 2**30


def default_kv_ram_bytes(free: int) -> int:
    """The RAM tier's default size: a tenth of ``free`` (RAM left over once the model is placed, or
    available now), at most :data:`KV_RAM_DEFAULT_MAX`."""
    return max(0, min(KV_RAM_DEFAULT_MAX, int(free) // 10))


class CacheSettings(BaseModel):
    """The prompt (KV) cache beyond the slots: host RAM, then disk (docs/kv-cache.md)."""

    kv_dir: Path | None = None
    """Where state blobs of cached prefixes live; default ``<cache_dir>/kv``."""
    kv_disk_bytes: int | None = Field(None, ge=0)
    """Byte budget of the disk tier, least recently used out first; unset: a default from free
    disk; 0: the disk tier is off."""
    kv_ram_bytes: int | None = Field(None, ge=0)
    """Host RAM for prefixes evicted from the slots; unset: a default from free RAM; 0: off."""
    checkpoints: int = Field(8, ge=0, le=256)
    """State checkpoints kept per sequence for hybrid, recurrent and sliding-window models (whose
    state cannot be cut back to any prefix); 0: none, so such models reuse only exact prefixes."""

    @field_validator("kv_dir", mode="after")
    @classmethod
    def _expand_kv(cls, v: Path | None) -> Path | None:
        return v.expanduser() if v is not None else None


class Settings(BaseSettings):
    """All of localrun's settings."""

    model_config = SettingsConfigDict(env_prefix="LOCALRUN_", env_nested_delimiter="__", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    """Where the index and localrun-owned files live."""
    cache_dir: Path = Field(default_factory=default_cache_dir)
    """Scratch and caches (the assembled default model, rendered plans)."""
    log_level: str = "WARNING"
    """Logging level for the CLI and server."""
    server: ServerSettings = Field(default_factory=ServerSettings)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    hub: HubSettings = Field(default_factory=HubSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    models: dict[str, ModelSettings] = Field(default_factory=dict)
    """Per-model overrides by model name ("*": every model); see ModelSettings."""
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    upstreams: list[UpstreamConfig] = Field(default_factory=list)
    """Other servers whose models localrun serves (``[[upstreams]]``; written by localrun/upstreams/config_file.py)."""

    @field_validator("data_dir", "cache_dir", mode="after")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = TomlConfigSettingsSource(settings_cls, toml_file=default_config_file())
        return (init_settings, env_settings, toml)

    @property
    def index_path(self) -> Path:
        return self.data_dir / "index.sqlite3"


def load_settings(**overrides: Any) -> Settings:
    """Build settings, turning validation and TOML errors into a ConfigError that names the file."""
    from pydantic import ValidationError

    from .errors import ConfigError

    if "api_key" not in (overrides.get("server") or {}) and os.environ.get("LOCALRUN_API_KEY"):
        overrides.setdefault("server", {})["api_key"] = os.environ["LOCALRUN_API_KEY"]
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(
            f"invalid settings: {exc}", hint=f"check {default_config_file()} and LOCALRUN_* variables"
        ) from exc
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise ConfigError(f"cannot read {default_config_file()}: {exc}", hint="fix the TOML syntax") from exc
