"""Chat: pick a model, a system prompt and sampling; replies stream in as Markdown.

The generation runs in a thread worker over ``Backend.stream`` (the same ModelManager the
server uses). The worker batches tokens into a message about every 30 ms so a fast model
cannot flood the event loop, and the Markdown stream coalesces further when rendering
falls behind: keys stay responsive while tokens pour in. Esc sets the Cancel the runtime
checks between tokens.

Slash commands are those of ``localrun run`` (localrun/chat/slash.py), never sent to the model:
``/help`` (``/?``) lists them, ``/clear`` forgets the conversation, ``/bye`` quits, and ``/image
PATH`` (``/audio PATH``) attaches a file to the next message, for a model whose projector takes
it (read from the record, as the Library shows it); a line in the transcript says what was
attached, and the message carries it to the runtime.

A reasoning model's thinking is split off the answer by the same code the server and
``localrun run`` use (:mod:`localrun.chat.reasoning`) and shows in a dimmed :class:`ThinkingBlock`
above the answer; the history keeps the answer alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual import getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Markdown, Select, Static
from textual.widgets.markdown import MarkdownStream

from localrun.chat.attach import place, read_media, require_media_support
from localrun.chat.reasoning import detect_format, split_chunks, template_of
from localrun.chat.slash import Slash, help_lines
from localrun.chat.slash import parse as parse_slash
from localrun.errors import ConfigError, LocalrunError, RuntimeUnavailable
from localrun.modelstore.builtins import CHAT_MODEL_NAME
from localrun.modelstore.capabilities import media as media_capabilities
from localrun.modelstore.projector import projector_path
from localrun.tui.base import LocalrunScreen
from localrun.tui.format import human_bytes
from localrun.tui.knobs import SamplingKnob
from localrun.types import Cancel, ChatRequest, Media, ModelRecord, Sampling
from localrun.types import Message as ChatMessage

if TYPE_CHECKING:
    from textual import events

    from localrun.chat.reasoning import ReasoningFormat
    from localrun.tui.backend import Backend

log = logging.getLogger(__name__)

#: How often the worker hands tokens to the UI at most.
BATCH_S = 0.03


@dataclass(frozen=True)
class ChatSettings:
    model: str
    system: str
    sampling: Sampling


def parse_sampling(temperature: str, top_p: str, max_tokens: str) -> Sampling:
    """The three inputs as Sampling; ConfigError names the field that is wrong."""

    def number(text: str, what: str, lo: float, hi: float, cast: Callable[[str], float] = float) -> float:
        try:
            value = cast(text.strip())
        except ValueError:
            raise ConfigError(
                f"{what} must be a number, not {text!r}", hint=f"enter a value between {lo} and {hi}"
            ) from None
        if not lo <= value <= hi:
            raise ConfigError(f"{what} {value} is out of range", hint=f"enter a value between {lo} and {hi}")
        return value

    return Sampling(
        temperature=number(temperature, "temperature", 0.0, 2.0),
        top_p=number(top_p, "top_p", 0.0, 1.0),
        max_tokens=int(number(max_tokens, "max tokens", 1, 1_000_000, int)),
    )


def rate_text(ttft_s: float | None, tokens: int, decode_s: float, *, running: bool) -> str:
    ttft = f"ttft {ttft_s * 1000:.0f} ms" if ttft_s is not None else "waiting for the first token…"
    rate = f" · {(tokens - 1) / decode_s:.1f} tok/s" if tokens > 1 and decode_s > 0 else ""
    return f"{ttft}{rate} · {tokens} tokens" + (" · esc stop" if running else "")


class ThinkingBlock(Static):
    """A reasoning model's thinking, dimmed under a "Thinking…" title, above its answer."""

    DEFAULT_CSS = """
    ThinkingBlock {
        color: $text-muted;
        text-style: italic;
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        padding: 0 1;
        margin: 0 0 1 0;
    }
    """

    def __init__(self) -> None:
        super().__init__("", markup=False, classes="thinking")
        self.border_title = "Thinking…"
        self.text = ""

    def add(self, text: str) -> None:
        self.text += text
        self.update(self.text)


class ChatScreen(LocalrunScreen):
    TAB = "chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+y", "copy_last", "Copy answer"),
        Binding("ctrl+l", "new_chat", "New chat"),
    ]

    @dataclass
    class Tokens(Message, bubble=False):
        """A batch of streamed text: answer text, and a reasoning model's thinking."""

        text: str
        stats: str
        reasoning: str = ""

    @dataclass
    class Finished(Message, bubble=False):
        text: str
        finish_reason: str | None
        stats: str

    model_select = getters.query_one("#model", Select)
    prompt = getters.query_one("#prompt", Input)
    transcript = getters.query_one("#transcript", VerticalScroll)
    stats = getters.query_one("#chat-stats", Static)

    def __init__(self) -> None:
        super().__init__()
        self.history: list[ChatMessage] = []
        self.last_answer: str = ""
        self._cancel: Cancel | None = None
        self._stream: MarkdownStream | None = None
        self._answer: Markdown | None = None  # the answer being streamed, below which no thinking goes
        self._thinking: ThinkingBlock | None = None
        self._wanted: str | None = None
        self._records: dict[str, ModelRecord] = {}
        self.attached: list[Media] = []  # for the next message

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="chat-model-row"):  # a row of its own: a long model name shows whole
            yield Select([], prompt="model", id="model", allow_blank=True)
        with Horizontal(id="chat-settings"):
            yield Input(placeholder="system prompt", id="system")
            yield Static("temp", classes="knob-label")
            yield SamplingKnob("0.7", what="temperature", lo=0.0, hi=2.0, id="temperature")
            yield Static("top_p", classes="knob-label")
            yield SamplingKnob("0.9", what="top_p", lo=0.0, hi=1.0, id="top-p")
            yield Static("max", classes="knob-label")
            yield SamplingKnob("512", what="max tokens", lo=1, hi=1_000_000, integer=True, id="max-tokens")
        yield VerticalScroll(id="transcript")
        with Horizontal(id="prompt-row"):
            # select_on_focus off: coming back to the prompt never puts its text under the next key
            yield Input(placeholder="> ask something, enter to send", id="prompt", select_on_focus=False)
            yield Static("", id="chat-stats", markup=False)

    def on_mount(self) -> None:
        self.watch(self.app, "models_version", lambda _v: self.read_models())
        self.read_models()
        self.prompt.focus()

    @property
    def generating(self) -> bool:
        return self._cancel is not None

    # -- models ---------------------------------------------------------------------------
    def read_models(self) -> None:
        if self.backend is None:
            self.stats.update(self.unavailable_text() or "")
            return
        backend = self.backend

        def job() -> None:
            records = backend.list_models()
            loaded = [m.name for m in backend.loaded()]
            self.app.call_from_thread(self._set_models, records, loaded)

        self.run_worker(job, thread=True, group="chat-models", exclusive=True, name="list models", exit_on_error=False)

    def _set_models(self, records: list[ModelRecord], loaded: list[str]) -> None:
        self._records = {r.name: r for r in records}
        names = list(self._records)
        current = self.model_select.value
        self.model_select.set_options([(n, n) for n in names])
        wanted = self._wanted if self._wanted in names else None
        fallback = (
            CHAT_MODEL_NAME if CHAT_MODEL_NAME in names else (names[0] if names else None)
        )  # an instruct model chats
        keep = wanted or current if (wanted or current) in names else next((n for n in loaded if n in names), fallback)
        if keep is not None:
            self.model_select.value = keep

    def select_model(self, name: str) -> None:
        """Used by the command palette ("Chat with …"); applied when the list arrives if it has not yet."""
        self._wanted = name
        if name in self._records:  # the select's options are these names (_set_models)
            self.model_select.value = name
        self.prompt.focus()

    def action_focus_model(self) -> None:
        self.model_select.focus()

    # -- sending --------------------------------------------------------------------------
    def current_settings(self) -> ChatSettings:
        model = self.model_select.value
        if not isinstance(model, str):
            raise ConfigError(
                "no model is chosen", hint="pick one in the model list at the top (or load one in the Library)"
            )
        sampling = parse_sampling(  # each field settled: a bad value goes back to its last good one, with a note
            *(self.query_one(f"#{name}", SamplingKnob).settle() for name in ("temperature", "top-p", "max-tokens"))
        )
        return ChatSettings(model, self.query_one("#system", Input).value.strip(), sampling)

    @on(Input.Submitted, "#prompt")
    async def _send(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if text and self.generating:  # the text stays in the prompt for when the answer is done
            self.notify("An answer is still coming: esc stops it, then enter sends this", timeout=3)
            return
        if not text:
            return
        command = parse_slash(text)
        if command is not None:  # never sent to the model: the same commands as `localrun run`
            await self._slash(command)
            return
        try:
            chat = self.current_settings()
        except ConfigError as exc:
            self.lapp.show_error(exc)
            return
        self.prompt.value = ""
        media, self.attached = tuple(self.attached), []
        self.history.append(ChatMessage("user", place(text, media), media=media))
        messages = ([ChatMessage("system", chat.system)] if chat.system else []) + self.history
        await self._add_turn("you", text)
        answer = await self._add_turn("ai", "")
        self._answer, self._thinking = answer, None
        self._stream = Markdown.get_stream(answer)
        self.transcript.anchor()
        self._cancel = Cancel()
        self.stats.update(
            f"loading {chat.model}…" if chat.model not in {m.name for m in self.lapp.loaded} else "thinking…"
        )
        self._generate(chat.model, ChatRequest(tuple(messages), chat.sampling), self._cancel)

    async def _slash(self, command: Slash) -> None:
        """A slash command (localrun/chat/slash.py): help and notes as lines of the transcript."""
        if command.problem:
            self.lapp.show_error(ConfigError(command.problem))
            return
        if command.name in ("image", "audio"):
            await self._attach_file(command)  # the line stays until the file is attached, to fix and retry
            return
        self.prompt.value = ""
        if command.name == "bye":
            self.app.exit()
        else:
            if command.name == "clear":
                self.history, self.attached = [], []
                await self.transcript.remove_children()
            lines = help_lines() if command.name == "help" else ["conversation cleared"]
            await self.transcript.mount(Static("\n".join(lines), classes="attached", markup=False))
            self.transcript.scroll_end(animate=False)

    async def _attach_file(self, command: Slash) -> None:
        """``/image PATH``: read the file now (a wrong path is said at once) and keep it for the next message."""
        kind, path = command.name, command.argument
        try:
            chat = self.current_settings()
            record = self._records.get(chat.model)
            item = await asyncio.to_thread(read_media, kind, path.strip())
            caps = await asyncio.to_thread(media_capabilities, record) if record else ()
            has_projector = bool(record and projector_path(record))
            require_media_support([item], caps, model=chat.model, has_projector=has_projector)
        except LocalrunError as exc:
            self.lapp.show_error(exc)
            return
        self.prompt.value = ""
        self.attached.append(item)
        line = f"attached {kind} {path.strip()} ({human_bytes(len(item.data))}) to the next message"
        await self.transcript.mount(Static(line, classes="attached", markup=False))
        self.transcript.scroll_end(animate=False)

    async def _add_turn(self, who: str, text: str) -> Markdown:
        label = Static(who, classes=f"who who-{who}")
        body = Markdown(text, classes=f"turn turn-{who}")
        await self.transcript.mount_all([label, body])
        return body

    def _reasoning_format(self, model: str, backend: Backend) -> ReasoningFormat | None:
        """The model's reasoning format, once per request (from its plan's template when the backend plans)."""
        record = self._records.get(model)
        if record is None:
            return None
        plan = None
        if backend.can_plan:
            try:
                plan = backend.plan(record)
            except LocalrunError as exc:  # the load will say it better; split by the GGUF's own template
                log.debug("no plan for %s to read its chat template from: %s", model, exc)
        return detect_format(template_of(record, plan))

    def _generate(self, model: str, req: ChatRequest, cancel: Cancel) -> None:
        backend = self.backend
        why = self.unavailable_text()

        def job() -> None:
            started = time.perf_counter()
            first = last = None
            parts: list[str] = []
            batch: list[str] = []
            thought: list[str] = []
            pieces = 0
            finish = None
            posted = started

            def stats(running: bool) -> str:
                ttft = first - started if first is not None else None
                return rate_text(ttft, pieces, (last - first) if first and last else 0.0, running=running)

            def post() -> None:
                self.post_message(self.Tokens("".join(batch), stats(True), "".join(thought)))
                batch.clear()
                thought.clear()

            try:
                if backend is None:
                    raise RuntimeUnavailable(why or "The model store is not available.")
                for chunk in split_chunks(backend.stream(model, req, cancel), self._reasoning_format(model, backend)):
                    if chunk.text or chunk.reasoning:
                        last = time.perf_counter()
                        first = first or last
                        pieces += 1
                        parts.append(chunk.text)
                        batch.append(chunk.text)
                        thought.append(chunk.reasoning)
                        if last - posted >= BATCH_S:
                            post()
                            posted = last
                    finish = chunk.finish_reason or finish
            finally:
                if batch:
                    post()
                self.post_message(
                    self.Finished("".join(parts), "cancelled" if cancel.is_set() else finish, stats(False))
                )

        self.run_worker(job, thread=True, group="generate", name=f"chat with {model}", exit_on_error=False)

    async def on_chat_screen_tokens(self, message: Tokens) -> None:
        if message.reasoning and self._answer is not None:
            if self._thinking is None:
                self._thinking = ThinkingBlock()
                await self.transcript.mount(self._thinking, before=self._answer)
            self._thinking.add(message.reasoning)
        if self._stream is not None and message.text:
            await self._stream.write(message.text)
        self.stats.update(message.stats)

    async def on_chat_screen_finished(self, message: Finished) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self._answer = None
        self._cancel = None
        if message.text:
            self.last_answer = message.text
            self.history.append(ChatMessage("assistant", message.text))
        elif self.history and self.history[-1].role == "user":
            self.history.pop()  # nothing came back (an error, an instant stop): let the question be asked again
        suffix = {"cancelled": " · stopped", "length": " · hit max tokens"}.get(message.finish_reason or "", "")
        self.stats.update(message.stats + suffix)

    # -- other actions ----------------------------------------------------------------------
    def action_stop(self) -> None:
        """Esc: stop the answer; when idle, toggle between the prompt and the transcript (where
        the arrows scroll, and a typed key goes back to the prompt with its character)."""
        if self._cancel is not None:
            self._cancel.set()
            self.stats.update("stopping…")
        elif self.focused is self.prompt:
            self.transcript.focus()
        else:
            self.prompt.focus()

    def on_key(self, event: events.Key) -> None:
        """A key typed while no text field has the focus (the transcript, after Esc) goes to the
        prompt: nothing typed is lost, and a digit or a q is text here, never a screen switch or quit."""
        if event.is_printable and event.character and not isinstance(self.focused, Input | Select):
            event.stop()
            event.prevent_default()
            self.prompt.focus()
            self.prompt.insert_text_at_cursor(event.character)

    def on_paste(self, event: events.Paste) -> None:
        """A paste while no text field has the focus goes to the prompt too (its first line, as an Input takes it)."""
        if event.text and not isinstance(self.focused, Input | Select):
            event.stop()
            self.prompt.focus()
            self.prompt.insert_text_at_cursor(event.text.splitlines()[0])

    @on(Input.Submitted, ".knob")
    def _knob_done(self) -> None:
        self.prompt.focus()

    def digits_switch(self) -> bool:
        return False  # typed keys are the prompt's here (on_key); F1–F5 switch screens

    def action_copy_last(self) -> None:
        if not self.last_answer:
            self.notify("No answer to copy yet", timeout=2)
            return
        self.app.copy_to_clipboard(self.last_answer)
        self.notify(f"Copied the last answer ({len(self.last_answer):,} characters)", timeout=2)

    async def action_new_chat(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
        self.history.clear()
        self.attached.clear()
        await self.transcript.remove_children()
        self.stats.update("")
        self.prompt.focus()
