"""Commands that run models: run (chat or complete in the terminal), serve, ps."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from localrun.cli.models import open_store
from localrun.cli.output import (
    Column,
    ctx_option,
    err_console,
    human_bytes,
    placement_options,
    placement_overrides,
    print_rows,
    settings_from,
)


def plan_options(f):
    """The planner overrides shared by run, serve and plan."""
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


def speculative_option(f):
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


def overrides_from(runtime, ctx_len, gpu_layers, device, threads, parallel=None, speculative=None, draft=None):
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


def make_manager(settings, store, overrides=None):
    from localrun.manager import ModelManager

    return ModelManager(settings, store, overrides=overrides)


def resolve_or_builtin(store, name: str):
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


def reasoning_format_of(manager, name: str):
    """The loaded model's reasoning format (None for a model without one), found once per session:
    loading here is the load the first answer would do anyway."""
    from localrun.chat.reasoning import detect_format, template_of

    lm = manager.load(name)
    return detect_format(template_of(lm.record, lm.plan))


class _Printer:
    """Writes one answer as it streams: the thinking dimmed on stderr under a "Thinking…" line (or not
    at all), the answer on stdout, so ``localrun run … > answer.txt`` holds the answer alone."""

    def __init__(self, show_thinking: bool) -> None:
        self.show_thinking = show_thinking
        self.thinking = False  # inside a shown thinking block

    def reasoning(self, text: str) -> None:
        if not self.show_thinking:
            return
        err = err_console()
        if not self.thinking:
            err.print("Thinking…", style="dim italic", highlight=False)
            self.thinking = True
        err.print(text, style="dim", end="", highlight=False, markup=False, soft_wrap=True)

    def answer(self, text: str) -> None:
        self.end_thinking()
        sys.stdout.write(text)
        sys.stdout.flush()

    def end_thinking(self) -> None:
        if self.thinking:
            err_console().print("\n", highlight=False)  # the block ends on its own line, a blank line before the answer
            self.thinking = False


def _stream_answer(manager, name: str, req, fmt=None, *, show_thinking: bool = True) -> str:
    """Print one answer as it streams (a reasoning model's thinking apart, see :class:`_Printer`);
    Ctrl-C stops it. Returns the answer's text, without the thinking."""
    from localrun.chat.reasoning import split_chunks
    from localrun.types import Cancel

    cancel = Cancel()
    printer = _Printer(show_thinking)
    parts: list[str] = []
    t0 = time.perf_counter()
    first = None
    pieces = 0
    usage = None
    finish = None
    stream = split_chunks(manager.stream(name, req, cancel), fmt)
    try:
        for chunk in stream:
            if chunk.text or chunk.reasoning:
                first = first or time.perf_counter()
                pieces += 1
            if chunk.reasoning:
                printer.reasoning(chunk.reasoning)
            if chunk.text:
                parts.append(chunk.text)
                printer.answer(chunk.text)
            if chunk.usage:
                usage = chunk.usage
            if chunk.finish_reason:
                finish = chunk.finish_reason
    except KeyboardInterrupt:
        cancel.set()
        stream.close()
        finish = "cancelled"
    end = time.perf_counter()
    printer.end_thinking()
    sys.stdout.write("\n")
    sys.stdout.flush()
    n = usage.completion_tokens if usage else pieces
    decode_s = end - (first or end)
    rate = (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0
    ttft = f"{((first or end) - t0) * 1000:.0f} ms"
    spec = ""
    if usage and usage.drafted_tokens:
        spec = (
            f" · drafted {usage.drafted_tokens}, accepted {usage.accepted_tokens} "
            f"({100 * usage.accepted_tokens / usage.drafted_tokens:.0f} %)"
        )
    err_console().print(
        f"[dim]{n} tokens · {rate:.1f} tok/s · first token {ttft}{spec} · {finish or 'done'}[/]", highlight=False
    )
    return "".join(parts)


@click.command("run")
@click.argument("name")
@click.argument("prompt", nargs=-1)
@click.option(
    "--raw/--chat",
    "raw",
    default=None,
    help=(
        "Complete the prompt as plain text, or chat with the model's template (default: chat when the model has a "
        "template)."
    ),
)
@click.option("--system", help="System prompt for chat.")
@click.option("--max-tokens", type=click.IntRange(1, None), default=None, help="Stop after this many tokens.")
@click.option("--temperature", type=click.FloatRange(0, 2), default=None)
@click.option("--seed", type=int, default=None)
@click.option("--image", "images", multiple=True, metavar="FILE", help="An image for a model that sees (repeatable).")
@click.option("--audio", "audios", multiple=True, metavar="FILE", help="An audio clip, wav or mp3 (repeatable).")
@click.option(
    "--hide-thinking",
    is_flag=True,
    help="Do not show a reasoning model's thinking (by default it streams dimmed on stderr, before the answer).",
)
@plan_options
@click.pass_context
def run_cmd(
    ctx,
    name,
    prompt,
    raw,
    system,
    max_tokens,
    temperature,
    seed,
    images,
    audios,
    hide_thinking,
    runtime,
    ctx_len,
    gpu_layers,
    device,
    threads,
    parallel,
    speculative,
    draft,
):
    """Chat with a model. With PROMPT, print one answer and exit; without, chat interactively.

    --image and --audio attach files to the prompt (to the first message of a chat).
    """
    from localrun.chat.attach import place, read_all
    from localrun.types import ChatRequest, CompletionRequest, Message, Sampling

    media = read_all(images, audios)  # before anything loads: a mistyped path costs nothing
    settings = settings_from(ctx)
    store = open_store(ctx)
    record = resolve_or_builtin(store, name)
    manager = make_manager(
        settings, store, overrides_from(runtime, ctx_len, gpu_layers, device, threads, parallel, speculative, draft)
    )
    sampling = {
        k: v for k, v in {"max_tokens": max_tokens, "temperature": temperature, "seed": seed}.items() if v is not None
    }
    if raw is None:
        raw = not record.metadata.get("chat_template")
    show = not hide_thinking
    try:
        fmt = None if raw else reasoning_format_of(manager, record.name)
        if media:
            _check_media(manager, record, media)
        if prompt:
            text = place(" ".join(prompt), media)
            if raw:
                req = CompletionRequest(prompt=text, sampling=Sampling(**sampling), media=media)
                _stream_answer(manager, record.name, req)
            else:
                msgs = ([Message("system", system)] if system else []) + [Message("user", text, media=media)]
                req = ChatRequest(messages=tuple(msgs), sampling=Sampling(**sampling))
                _stream_answer(manager, record.name, req, fmt, show_thinking=show)
            return
        _interactive(manager, record, raw, system, sampling, fmt, show_thinking=show, media=media)
    finally:
        manager.shutdown()


def _check_media(manager, record, media) -> None:
    """Refuse media the model cannot take (a text-only model: how to give it a projector)."""
    from localrun.chat.attach import require_media_support
    from localrun.types import META_PROJECTOR

    caps = manager.load(record.name).handle.capabilities or ()
    require_media_support(media, caps, model=record.name, has_projector=bool(record.metadata.get(META_PROJECTOR)))


def _interactive(
    manager, record, raw: bool, system: str | None, sampling: dict, fmt=None, *, show_thinking: bool = True, media=()
) -> None:
    from localrun.chat.attach import place
    from localrun.types import ChatRequest, CompletionRequest, Message, Sampling

    mode = "completion" if raw else "chat"
    err_console().print(
        f"[dim]{record.name} · {mode} · /bye or Ctrl-D to quit · Ctrl-C stops an answer[/]", highlight=False
    )
    history: list[Message] = [Message("system", system)] if system else []
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            err_console().print()
            return
        except KeyboardInterrupt:
            err_console().print()
            continue
        if line.strip() in ("/bye", "/exit", "/quit"):
            return
        if not line.strip():
            continue
        line, turn_media, media = place(line, media), media, ()  # files given on the command line: the first turn
        if raw:
            req = CompletionRequest(prompt=line, sampling=Sampling(**sampling), media=turn_media)
            _stream_answer(manager, record.name, req)
            continue
        history.append(Message("user", line, media=turn_media))
        req = ChatRequest(messages=tuple(history), sampling=Sampling(**sampling))
        answer = _stream_answer(manager, record.name, req, fmt, show_thinking=show_thinking)
        history.append(Message("assistant", answer))  # the answer alone: templates drop earlier thinking anyway


def pooling_settings(items) -> dict:
    """``--pooling`` values as ``Settings.models`` entries: ``KIND`` for every model ("*"), ``MODEL=KIND`` for one."""
    from localrun.planning.overrides import check_pooling

    out: dict = {}
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
@click.pass_context
def serve_cmd(
    ctx,
    host,
    port,
    api_key,
    runtime,
    ctx_len,
    parallel,
    no_default_model,
    poolings,
    mirror,
    slot_save_path,
    speculative,
    draft,
):
    """Serve loaded models over OpenAI- and Ollama-compatible HTTP APIs."""
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
    overrides = {"server": server} if server else {}
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
    store = open_store(ctx)
    if not no_default_model:
        store.ensure_default_model()
        store.ensure_chat_model()
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


@click.command("ps")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def ps_cmd(ctx, as_json):
    """Show the models the running server has loaded."""

    import httpx

    from localrun.errors import RuntimeUnavailable
    from localrun.tui.format import cache_cell

    settings = settings_from(ctx)
    host = "127.0.0.1" if settings.server.host in ("0.0.0.0", "::") else settings.server.host
    url = f"http://{host}:{settings.server.port}/api/ps"
    headers = {}
    if settings.server.api_key:
        headers["Authorization"] = f"Bearer {settings.server.api_key.get_secret_value()}"
    try:
        data = httpx.get(url, headers=headers, timeout=3).raise_for_status().json()
    except httpx.HTTPError as exc:
        raise RuntimeUnavailable(
            f"no localrun server answered at {url}: {exc}", hint="start one with `localrun serve`"
        ) from exc

    def ttl(m: dict) -> str:
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


COMMANDS = [run_cmd, serve_cmd, ps_cmd]
