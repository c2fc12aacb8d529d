"""Not a command: what the commands that load a model share — the store, a model by name (the
embedded defaults assembled on first use), the manager, the planner's options and overrides —
and how the commands that talk to the running server (ps, stop) reach it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from localrun.cli.output import F, ctx_option, placement_options, placement_overrides, settings_from

if TYPE_CHECKING:
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.planning.planner import PlanOverrides
    from localrun.settings import Settings
    from localrun.types import ModelRecord


def open_store(ctx: click.Context) -> ModelStore:
    from localrun.modelstore.store import ModelStore

    return ModelStore(settings_from(ctx))


def plan_options(f: F) -> F:
    """The planner overrides shared by run and plan (serve takes its own, as settings)."""
    f = click.option("--runtime", help="Runtime to use (llama.cpp, mlx, ollama, mlc, fake).")(f)
    f = ctx_option('Context length to load with (beats [models."NAME"] ctx and runtime.ctx).')(f)
    f = click.option("--gpu-layers", type=int, help="Layers to offload to the GPU (-1: all).")(f)
    f = click.option("--device", help="Device: cpu, cuda, metal…")(f)
    f = click.option("--threads", type=click.IntRange(1, 1024), help="CPU threads.")(f)
    f = click.option(
        "--parallel",
        type=click.IntRange(1, 64),
        help="Requests a llama.cpp model decodes at once, each with the whole context.",
    )(f)
    f = speculative_option(f)
    return placement_options()(f)


def speculative_option(f: F) -> F:
    f = click.option(
        "--draft",
        default=None,
        metavar="MODEL",
        help="Draft model for speculative decoding: a model in the store or a .gguf file; none: no draft "
        "(default: a GGUF whose name contains 'draft' beside the model).",
    )(f)
    return click.option(
        "--speculative",
        type=click.Choice(["auto", "off", "ngram", "draft"], case_sensitive=False),
        default=None,
        help="Speculative decoding in llama.cpp: auto drafts (n-gram lookup, the draft "
        "model) only while it pays; ngram or draft at every step; off.",
    )(f)


def overrides_from(
    runtime: str | None,
    ctx_len: int | None,
    gpu_layers: int | None,
    device: str | None,
    threads: int | None,
    parallel: int | None = None,
    speculative: str | None = None,
    draft: str | None = None,
) -> PlanOverrides | None:
    placed = placement_overrides()  # --kv-type, --cpu-moe, --n-cpu-moe (and serve's --gpu-layers)
    values = (runtime, ctx_len, gpu_layers, device, threads, parallel, speculative, draft)
    if not placed and not any(v is not None for v in values):
        return None
    from localrun.planning.planner import PlanOverrides

    if gpu_layers is not None:
        placed["n_gpu_layers"] = gpu_layers
    return PlanOverrides(
        runtime=runtime,
        n_ctx=ctx_len,
        device=device,
        threads=threads,
        parallel=parallel,
        speculative=speculative,
        draft=draft,
        **placed,
    )


def make_manager(settings: Settings, store: ModelStore, overrides: PlanOverrides | None = None) -> ModelManager:
    from localrun.manager import ModelManager

    return ModelManager(settings, store, overrides=overrides)


def resolve_or_builtin(store: ModelStore, name: str) -> ModelRecord:
    """Resolve ``name``; the embedded default model is assembled on first use."""
    from localrun.errors import ModelNotFound

    try:
        return store.resolve(name, allow_path=True)
    except ModelNotFound:
        from localrun.modelstore.builtins import CHAT_MODEL_NAME, DEFAULT_MODEL_NAME

        if name not in (DEFAULT_MODEL_NAME, CHAT_MODEL_NAME):
            raise
        record = store.ensure_default_model() if name == DEFAULT_MODEL_NAME else store.ensure_chat_model()
        if record is None:
            raise
        return record


# --- the running server, for the commands that talk to it (ps, stop) ----------------------


def server_url(settings: Settings) -> str:
    host = "127.0.0.1" if settings.server.host in ("0.0.0.0", "::") else settings.server.host
    return f"http://{host}:{settings.server.port}"


def call_server(settings: Settings, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """The JSON answer of ``method path`` on the running server.

    Raises:
        RuntimeUnavailable: no server answered (the hint says how to start one).
        LocalrunError: the server refused (its message, e.g. a 404's "did you mean …?").
    """
    import httpx

    from localrun.errors import LocalrunError, ModelNotFound, RuntimeUnavailable

    url = server_url(settings) + path
    headers: dict[str, str] = {}
    if settings.server.api_key:
        headers["Authorization"] = f"Bearer {settings.server.api_key.get_secret_value()}"
    try:
        answer = httpx.request(method, url, headers=headers, json=body, timeout=30)
    except httpx.HTTPError as exc:
        raise RuntimeUnavailable(
            f"no localrun server answered at {url}: {exc}", hint="start one with `localrun serve`"
        ) from exc
    if answer.is_success:
        return answer.json()
    try:
        error = answer.json().get("error")
    except ValueError:
        error = None
    message = error.get("message") if isinstance(error, dict) else error
    cls = ModelNotFound if answer.status_code == 404 else LocalrunError
    raise cls(str(message or f"{method} {path}: HTTP {answer.status_code}"))
