"""Settings: one pydantic-settings class, layered.

Precedence, highest first: explicit keyword arguments (the CLI's flags), ``LOCALRUN_*``
environment variables (nested with ``__``, e.g. ``LOCALRUN_SERVER__PORT=9000``), the TOML
config file (``$LOCALRUN_CONFIG`` or ``<config dir>/config.toml``), then defaults. Paths
come from platformdirs unless ``LOCALRUN_HOME`` puts everything under one folder (tests
and portable installs use that). Nothing is read or written at import time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from localrun.upstreams.config_file import UpstreamConfig, UpstreamSettings

APP_NAME = "localrun"
#: Not 11434 (Ollama), 1234 (LM Studio), 8080 (llama-server, mlx_lm, llamafile) or 8000 (mlc, llama_cpp.server).
DEFAULT_PORT = 8739


def _dirs():
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
    """Origins allowed by CORS; empty means CORS is off."""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    """Largest request body accepted."""
    queue_size: int = Field(16, ge=1, le=10_000)
    """Requests that may wait per model before new ones get 503 + Retry-After."""
    strict_fields: bool = False
    """Refuse request fields localrun does not know (OpenAI's rule) instead of ignoring them and naming them in X-Localrun-Ignored-Fields."""
    reasoning_field: Literal["both", "reasoning_content", "reasoning"] = "both"
    """Where OpenAI chat answers carry a reasoning model's thinking: ``reasoning_content``
    (DeepSeek, llama.cpp), ``reasoning`` (gpt-oss, vLLM, Ollama) or both (clients read either)."""
    mirror: bool = False
    """Also serve the model store as a Hugging Face hub mirror on the same port (`serve --mirror`)."""


class RuntimeSettings(BaseModel):
    """How models are loaded and run."""

    threads: int | None = Field(None, ge=1, le=1024)
    """CPU threads for llama.cpp; default: the number of physical cores."""
    context_length: int | None = Field(None, ge=64)
    """Cap on the context a model is loaded with; default: the planner's choice."""
    max_context_default: int = Field(8192, ge=64)
    """Largest context the planner picks on its own when the model's trained length is bigger."""
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
    template_timeout_s: float = Field(2.0, gt=0, le=60)
    """Time budget for rendering one chat template."""
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


class ModelSettings(BaseModel):
    """Per-model overrides (``[models."NAME"]`` in config.toml; ``[models."*"]`` for every model)."""

    pooling: Literal["mean", "cls", "last", "none", "rank"] | None = None
    """How embeddings pool the token vectors; lets a generative model (Gemma) serve /v1/embeddings."""
    chat_template_file: Path | None = None
    """A Jinja chat template to use instead of the GGUF's (rendered in the same sandbox)."""


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
    models: dict[str, ModelSettings] = Field(default_factory=dict)
    """Per-model overrides by model name ("*": every model); see ModelSettings."""
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    upstreams: list[UpstreamConfig] = Field(default_factory=list)
    """Other servers whose models localrun serves (``[[upstreams]]``; see localrun/upstreams.py)."""

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
        raise ConfigError(f"invalid settings: {exc}", hint=f"check {default_config_file()} and LOCALRUN_* variables") from exc
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise ConfigError(f"cannot read {default_config_file()}: {exc}", hint="fix the TOML syntax") from exc
