"""``localrun run``: chat with a model, or complete a prompt, in the terminal."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from localrun.cli.common import make_manager, open_store, overrides_from, plan_options, resolve_or_builtin
from localrun.cli.loading import announce_first_use, completion_note, for_one_user, load_visibly
from localrun.cli.output import err_console, settings_from

if TYPE_CHECKING:
    from localrun.chat.reasoning import ReasoningFormat
    from localrun.chat.slash import Slash
    from localrun.manager import ModelManager
    from localrun.types import ChatRequest, CompletionRequest, Media, ModelRecord


def reasoning_format_of(manager: ModelManager, name: str) -> ReasoningFormat | None:
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


def _stream_answer(
    manager: ModelManager,
    name: str,
    req: ChatRequest | CompletionRequest,
    fmt: ReasoningFormat | None = None,
    *,
    show_thinking: bool = True,
    load_s: float = 0.0,
) -> str:
    """Print one answer as it streams (a reasoning model's thinking apart, see :class:`_Printer`);
    Ctrl-C stops it. Returns the answer's text, without the thinking. ``load_s``: the load that
    came before it, given apart from the first token in the summary."""
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
    load = f"load {load_s:.1f} s · " if load_s else ""
    err_console().print(
        f"[dim]{load}{n} tokens · {rate:.1f} tok/s · first token {ttft}{spec} · {finish or 'done'}[/]",
        highlight=False,
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
    ctx: click.Context,
    name: str,
    prompt: tuple[str, ...],
    raw: bool | None,
    system: str | None,
    max_tokens: int | None,
    temperature: float | None,
    seed: int | None,
    images: tuple[str, ...],
    audios: tuple[str, ...],
    hide_thinking: bool,
    runtime: str | None,
    ctx_len: int | None,
    gpu_layers: int | None,
    device: str | None,
    threads: int | None,
    parallel: int | None,
    speculative: str | None,
    draft: str | None,
) -> None:
    """Chat with a model. With PROMPT, print one answer and exit; without, chat interactively.

    --image and --audio attach files to the prompt (to the first message of a chat).
    """
    from localrun.chat.attach import place, read_all
    from localrun.types import ChatRequest, CompletionRequest, Message, Sampling

    media = read_all(images, audios)  # before anything loads: a mistyped path costs nothing
    piped = piped_stdin()
    if piped:  # as Ollama does: what was piped in, then the prompt's words, one prompt, one answer
        prompt = (piped, *prompt)
    settings = for_one_user(settings_from(ctx))
    store = open_store(ctx)
    announce_first_use(store, name)
    record = resolve_or_builtin(store, name)
    manager = make_manager(
        settings,
        store,
        overrides_from(runtime, ctx_len, gpu_layers, device, threads, parallel or 1, speculative, draft),
    )
    sampling: dict[str, Any] = {
        k: v for k, v in {"max_tokens": max_tokens, "temperature": temperature, "seed": seed}.items() if v is not None
    }
    if raw is None:
        raw = not record.metadata.get("chat_template")
    show = not hide_thinking
    note = completion_note(record, raw, max_tokens, settings.runtime.completion_max_tokens)
    if note:
        err_console().print(f"[dim]{note}[/]", highlight=False)
    try:
        load_s = load_visibly(manager, record)
        fmt = None if raw else reasoning_format_of(manager, record.name)
        if media:
            _check_media(manager, record, media)
        if prompt:
            text = place(" ".join(prompt), media)
            if raw:
                completion = CompletionRequest(prompt=text, sampling=Sampling(**sampling), media=media)
                _stream_answer(manager, record.name, completion, load_s=load_s)
            else:
                msgs = ([Message("system", system)] if system else []) + [Message("user", text, media=media)]
                chat = ChatRequest(messages=tuple(msgs), sampling=Sampling(**sampling))
                _stream_answer(manager, record.name, chat, fmt, show_thinking=show, load_s=load_s)
            return
        if load_s:
            err_console().print(f"[dim]loaded {record.name} in {load_s:.1f} s[/]", highlight=False)
        _interactive(manager, record, raw, system, sampling, fmt, show_thinking=show, media=media)
    finally:
        manager.shutdown()


def piped_stdin() -> str:
    """What a pipe or a file on stdin holds (``cat notes.txt | localrun run m "sum up"``); "" for a
    terminal or anything else (a test runner's stand-in, /dev/null), which is never waited on."""
    import os
    import stat

    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError and a ValueError
        return ""
    if sys.stdin.isatty() or not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        return ""
    return sys.stdin.read().strip()


def _check_media(manager: ModelManager, record: ModelRecord, media: Sequence[Media]) -> None:
    """Refuse media the model cannot take (a text-only model: how to give it a projector)."""
    from localrun.chat.attach import require_media_support
    from localrun.types import META_PROJECTOR

    caps = manager.load(record.name).handle.capabilities or ()
    require_media_support(media, caps, model=record.name, has_projector=bool(record.metadata.get(META_PROJECTOR)))


def _interactive(
    manager: ModelManager,
    record: ModelRecord,
    raw: bool,
    system: str | None,
    sampling: dict[str, Any],
    fmt: ReasoningFormat | None = None,
    *,
    show_thinking: bool = True,
    media: tuple[Media, ...] = (),
) -> None:
    from localrun.chat.attach import place
    from localrun.chat.slash import parse
    from localrun.types import ChatRequest, CompletionRequest, Message, Sampling

    mode = "completion" if raw else "chat"
    err_console().print(
        f"[dim]{record.name} · {mode} · /? for help · /bye or Ctrl-D to quit · Ctrl-C stops an answer[/]",
        highlight=False,
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
        command = parse(line)
        if command is not None:
            if command.name == "bye" and not command.problem:
                return
            if command.name == "clear" and not command.problem:
                history = history[:1] if system else []
            media = _slash(manager, record, command, media)
            continue
        if not line.strip():
            continue
        line, turn_media, media = place(line, media), media, ()  # files given on the command line: the first turn
        if raw:
            completion = CompletionRequest(prompt=line, sampling=Sampling(**sampling), media=turn_media)
            _stream_answer(manager, record.name, completion)
            continue
        history.append(Message("user", line, media=turn_media))
        req = ChatRequest(messages=tuple(history), sampling=Sampling(**sampling))
        answer = _stream_answer(manager, record.name, req, fmt, show_thinking=show_thinking)
        history.append(Message("assistant", answer))  # the answer alone: templates drop earlier thinking anyway


def _slash(manager: ModelManager, record: ModelRecord, command: Slash, media: tuple[Media, ...]) -> tuple[Media, ...]:
    """Do ``command`` (help, a file to attach, what /clear says; /bye is the caller's); the media for
    the next message. Nothing here reaches the model."""
    from rich.markup import escape

    from localrun.chat.attach import read_media
    from localrun.chat.slash import help_lines
    from localrun.cli.output import human_bytes
    from localrun.errors import LocalrunError

    err = err_console()
    if command.problem:
        err.print(f"[bold red]error:[/] {escape(command.problem)}", highlight=False)
    elif command.name == "help":
        for line in help_lines():
            err.print(line, highlight=False, markup=False)
    elif command.name == "clear":
        err.print("[dim]conversation cleared[/]", highlight=False)
        return ()
    elif command.name in ("image", "audio"):
        try:
            item = read_media(command.name, command.argument)
            _check_media(manager, record, [item])
        except LocalrunError as exc:
            err.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False)
            return media
        err.print(f"attached {command.argument} ({human_bytes(len(item.data))}) to your next message", markup=False)
        return (*media, item)
    return media


COMMAND = run_cmd
