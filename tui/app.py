"""The localrun TUI app: holds the shared state, serves, and shows errors. Screens do the rest.

State the screens watch lives here as reactives (what is loaded, the server's state, the
machine's facts, the pulls in progress, a counter bumped when the model list changes);
streams of events (the request log, tokens/s samples) are signals. Thread workers post
messages; the app folds them in. One handler turns every worker error into one
notification with a title and the action to take.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.signal import Signal
from textual.worker import Worker, WorkerState

from localrun.errors import LocalrunError
from localrun.tui.backend import Backend, LocalBackend
from localrun.tui.chat import ChatScreen
from localrun.tui.commands import ModelCommands
from localrun.tui.discover import DiscoverScreen
from localrun.tui.downloads import Downloads
from localrun.tui.embedded import EmbeddedServer, check_port, find_free_port
from localrun.tui.errors import describe_error
from localrun.tui.hardware_view import HardwareScreen
from localrun.tui.header import TABS
from localrun.tui.library import LibraryScreen
from localrun.tui.messages import (
    DownloadUpdated,
    FactsReady,
    LoadedChanged,
    ModelsChanged,
    Notice,
    RequestLogged,
    ServerChanged,
    ServerState,
)
from localrun.tui.metering import RequestLogEntry, RequestMeter
from localrun.tui.modals import PortModal
from localrun.tui.server_view import ServerScreen

if TYPE_CHECKING:
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

log = logging.getLogger(__name__)

LOG_KEEP = 500
RATE_KEEP = 120
#: The same error within this many seconds is not shown again (a poll that keeps failing).
ERROR_REPEAT_S = 30.0


class LocalrunApp(App[None]):
    """Library, Discover, Hardware, Server and Chat over one store and one ModelManager."""

    CSS_PATH = "localrun.tcss"
    TITLE = "localrun"
    MODES = {
        "library": LibraryScreen,
        "discover": DiscoverScreen,
        "hardware": HardwareScreen,
        "server": ServerScreen,
        "chat": ChatScreen,
    }
    DEFAULT_MODE = "library"
    COMMANDS = App.COMMANDS | {ModelCommands}
    BINDINGS = [
        *(Binding(str(n), f"switch_mode('{mode}')", label, show=False) for n, (mode, label) in enumerate(TABS, 1)),
        *(
            Binding(f"f{n}", f"switch_mode('{mode}')", label, show=False, priority=True)
            for n, (mode, label) in enumerate(TABS, 1)
        ),
        Binding("q", "quit", "Quit"),
    ]

    server_state: reactive[ServerState] = reactive(ServerState, init=False)
    loaded: reactive[tuple[Any, ...]] = reactive(tuple, init=False)
    facts: reactive[Any] = reactive(None, init=False)
    downloads: reactive[tuple[Any, ...]] = reactive(tuple, init=False)
    models_version: reactive[int] = reactive(0, init=False)

    def __init__(
        self,
        *,
        settings: Settings,
        manager: ModelManager | None = None,
        store: ModelStore | None = None,
        backend: Backend | None = None,
        serve: bool = True,
        facts: tuple[Any, dict[str, Any]] | None = None,
        backend_error: str | None = None,
        log_path: str | None = None,
        poll_s: float = 1.0,
        default_model: bool = False,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.meter = RequestMeter(self._on_request_entry)
        self.manager = manager
        if manager is not None:  # the request log and tokens/s follow the manager's request timings
            manager.observe_requests(self.meter.observe)
        self.store = store
        if backend is None and manager is not None and store is not None:
            backend = LocalBackend(store=store, manager=manager)
        self.backend: Backend | None = backend
        self.backend_error = backend_error
        self.serve = serve
        self._injected_facts = facts
        self.log_path = log_path
        self.poll_s = poll_s
        self.default_model = default_model
        #: What the upstreams served at the last poll (name, health, models); only the poll worker touches it.
        self._upstreams_seen: tuple[Any, ...] = ()
        self.owned_manager: ModelManager | None = None  # set by make_app when it made the manager
        self.embedded: EmbeddedServer | None = None
        self.request_log: deque[RequestLogEntry] = deque(maxlen=LOG_KEEP)
        self.token_rates: deque[float] = deque([0.0] * RATE_KEEP, maxlen=RATE_KEEP)
        self.request_signal: Signal[RequestLogEntry] = Signal(self, "request")
        self.rate_signal: Signal[float] = Signal(self, "rate")
        self.pulls = Downloads(self)
        self._tokens_seen = 0
        self._recent_errors: dict[tuple[str, str], float] = {}
        key = bool(settings.server.api_key)
        self.server_state = ServerState("starting" if serve else "off", key=key)

    # -- start and stop ----------------------------------------------------------------------
    def on_mount(self) -> None:
        if self._injected_facts is not None:
            self.facts = self._injected_facts
        else:
            self.detect_facts()
        self.set_interval(self.poll_s, self._poll_loaded)
        self.set_interval(1.0, self._sample_rate)
        if self.serve:
            self.call_after_refresh(self.start_serving)
        if self.default_model and self.store is not None:
            self.register_default_model()

    @work(thread=True, exit_on_error=False, group="default-model", name="register the default model")
    def register_default_model(self) -> None:
        """The embedded Gemma is assembled on first use (seconds): after the first paint, never
        before; the default chat model (SmolLM2, fetched by the set-up) is registered beside it."""
        store = self.store
        if store is None:  # started only with a store (on_mount)
            return
        for record in (store.ensure_default_model(), store.ensure_chat_model()):
            if record is not None:
                self.post_message(ModelsChanged(f"default model {record.name}"))

    @work(thread=True, exit_on_error=False, group="facts", exclusive=True, name="detect hardware")
    def detect_facts(self, refresh: bool = False) -> None:
        from localrun.planning.facts import machine_facts

        hw, statuses = machine_facts(self.settings, refresh=refresh)
        self.post_message(FactsReady(hw, statuses))

    def on_facts_ready(self, message: FactsReady) -> None:
        self.facts = (message.hardware, message.statuses)

    @work(exclusive=True, group="serve", exit_on_error=False, name="start the server")
    async def start_serving(self, port: int | None = None) -> None:
        host = self.settings.server.host
        port = port or self.settings.server.port
        key = self.settings.server.api_key
        check = await asyncio.to_thread(check_port, host, port, api_key=key.get_secret_value() if key else None)
        if check.state == "localrun":
            self._attach_server(check.url)
            return
        if check.state == "other":
            free = await asyncio.to_thread(find_free_port, host, port)
            choice = await self.push_screen_wait(PortModal(check.detail, free))
            if choice is None:
                self.post_message(ServerChanged(ServerState("off", key=self.server_state.key, detail=check.detail)))
                return
            port = choice
        if self.manager is None:
            self.post_message(ServerChanged(ServerState("off", detail=self.backend_error or "no model manager")))
            return
        self.embedded = EmbeddedServer(
            self.settings, self.manager, host=host, port=port, middleware=self.meter.middleware
        )
        try:
            url = await self.embedded.start()
        except Exception as exc:  # any start failure: the header says it, the worker's handler reports it
            self.post_message(
                ServerChanged(ServerState("failed", key=self.server_state.key, detail=f"{type(exc).__name__}: {exc}"))
            )
            raise
        self.post_message(ServerChanged(ServerState("embedded", url, key=bool(self.settings.server.api_key))))

    def _attach_server(self, url: str) -> None:
        from localrun.tui.remote import RemoteBackend

        key = self.settings.server.api_key
        self.backend = RemoteBackend(url, api_key=key.get_secret_value() if key else None)
        self.post_message(
            ServerChanged(
                ServerState(
                    "attached",
                    url,
                    key=bool(key),
                    detail="another localrun serves this port; this window is its client",
                )
            )
        )
        self.post_message(ModelsChanged("attached"))
        self.notify(f"Another localrun serves {url}: this window manages it as a client.", title="Attached")

    def on_server_changed(self, message: ServerChanged) -> None:
        self.server_state = message.state

    async def stop_serving(self) -> None:
        if self.embedded is not None:
            await self.embedded.stop()
            self.embedded = None

    async def action_quit(self) -> None:
        """Quit; while a pull is running, only after a yes (the pull resumes next time)."""
        running = self.pulls.active_refs()
        if not running:
            await self._quit_now()
            return
        from localrun.tui.modals import ConfirmModal

        async def answered(yes: bool | None) -> None:
            if yes:
                await self._quit_now()

        question = (
            f"{len(running)} pull(s) running ({', '.join(running[:3])}). Quit and stop them? "
            "Pulling again later resumes where they stopped."
        )
        self.push_screen(ConfirmModal("Quit localrun?", question, yes="Quit"), answered)

    async def _quit_now(self) -> None:
        self.pulls.cancel_all()
        await self.stop_serving()
        self.exit()

    async def on_unmount(self) -> None:
        """However the app ends, the server stops cleanly (its lifespan runs) before the loop goes."""
        self.pulls.cancel_all()
        await self.stop_serving()

    # -- polling -----------------------------------------------------------------------------
    def _poll_loaded(self) -> None:
        if self.backend is None:
            return
        backend = self.backend

        def job() -> None:
            self.post_message(LoadedChanged(tuple(backend.loaded())))
            # Upstream models come and go with their servers' health and model lists, which
            # nothing in this process announces: a change in what they serve re-lists the models.
            served = tuple((u.get("name"), u.get("health"), tuple(u.get("models") or ())) for u in backend.upstreams())
            if served != self._upstreams_seen:
                self._upstreams_seen = served
                self.post_message(ModelsChanged("upstreams changed"))

        self.run_worker(job, thread=True, group="poll", exclusive=True, name="read loaded models", exit_on_error=False)

    def on_loaded_changed(self, message: LoadedChanged) -> None:
        self.loaded = message.loaded

    def on_models_changed(self, message: ModelsChanged) -> None:
        self.models_version += 1
        self._poll_loaded()

    def _sample_rate(self) -> None:
        total = self.meter.tokens_total
        self.token_rates.append(float(total - self._tokens_seen))
        self._tokens_seen = total
        self.rate_signal.publish(self.token_rates[-1])

    def _on_request_entry(self, entry: RequestLogEntry) -> None:
        """Called from the event loop or a worker thread: hop onto the app's queue."""
        self.post_message(RequestLogged(entry))

    def on_request_logged(self, message: RequestLogged) -> None:
        self.request_log.append(message.entry)
        self.request_signal.publish(message.entry)

    def on_download_updated(self, message: DownloadUpdated) -> None:
        self.pulls.update(message.state)

    # -- messages for people -----------------------------------------------------------------
    def on_notice(self, message: Notice) -> None:
        self.notify(message.text, title=message.title, timeout=4)

    def show_error(self, exc: BaseException, *, doing: str = "") -> None:
        """The one place an error reaches the screen: once, with a title and an action."""
        view = describe_error(exc, doing=doing, log_hint=self.log_path)
        now = time.monotonic()
        key = (view.title, view.message)
        if now - self._recent_errors.get(key, -ERROR_REPEAT_S) < ERROR_REPEAT_S:
            return
        self._recent_errors[key] = now
        if isinstance(exc, LocalrunError):
            log.info("%s: %s", view.title, exc)
        else:  # a bug: the traceback goes to the log the notification points at
            log.error("%s", view.title, exc_info=exc)
        self.notify(view.text(), title=view.title, severity="error", timeout=10)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self.show_error(event.worker.error, doing=event.worker.name)

    # -- command palette ---------------------------------------------------------------------
    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for number, (mode, label) in enumerate(TABS, 1):
            yield SystemCommand(
                f"Go to {label}",
                f"Switch to the {label} screen (key {number})",
                lambda mode=mode: self.switch_mode(mode),
            )
