"""What every localrun screen shares: the frame (header, body, footer) and one way to run
blocking work.

``run_blocking`` is the usual door to slow calls: it runs a function in a thread worker
and, when it returns, posts the follow-up messages. When a screen's worker raises, the
worker's ``StateChanged`` (which does not bubble) is handed here to the app's one error
display, :meth:`LocalrunApp.show_error`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Input, Select, Static
from textual.worker import Worker, WorkerState

from localrun.errors import RuntimeUnavailable
from localrun.tui.header import AppHeader
from localrun.tui.messages import ModelsChanged, Notice

if TYPE_CHECKING:
    from textual import events

    from localrun.tui.app import LocalrunApp
    from localrun.tui.backend import Backend

log = logging.getLogger(__name__)


class LocalrunScreen(Screen[Any]):
    """A tab of the app: header on top, footer with its bindings below."""

    TAB: ClassVar[str] = ""
    #: The text field that takes a typed key nothing else on the screen wants (Library's filter,
    #: Discover's search): a letter typed on a table starts a filter or a search, it never vanishes.
    TYPE_TO: ClassVar[str | None] = None

    @property
    def lapp(self) -> LocalrunApp:
        return self.app  # type: ignore[return-value]

    @property
    def backend(self) -> Backend | None:
        return self.lapp.backend

    def need_backend(self) -> Backend:
        """The backend, for an action a screen offers only with one (:meth:`unavailable_text` says why not)."""
        backend = self.backend
        if backend is None:
            raise RuntimeUnavailable(self.unavailable_text() or "The model store is not available.")
        return backend

    def compose(self) -> ComposeResult:
        yield AppHeader(self.TAB)
        yield from self.compose_body()
        yield Footer(compact=True)  # every screen's keys fit in 80 columns

    def digits_switch(self) -> bool:
        """Whether the keys 1–5 switch screens now: never while a text field has the keys, so a
        digit typed is a digit (F1–F5 always switch; the header's tabs show which keys work)."""
        return not isinstance(self.focused, Input)

    def on_key(self, event: events.Key) -> None:
        """A printable key nothing here takes goes to :attr:`TYPE_TO`, or is answered with a note."""
        if not event.is_printable or not event.character:
            return
        if isinstance(self.focused, Input | Select) or event.key in self.active_bindings:
            return  # a text field takes its own keys; a bound key does what the footer says
        event.stop()
        event.prevent_default()
        if self.TYPE_TO is None:
            self.notify(f"{event.character} does nothing here: this screen's keys are in the footer", timeout=2)
            return
        field = self.query_one(self.TYPE_TO, Input)
        field.focus()
        field.insert_text_at_cursor(event.character)

    def compose_body(self) -> ComposeResult:  # pragma: no cover - every screen overrides it
        yield Static()

    def unavailable_text(self) -> str | None:
        """Why this screen cannot work (no backend), in words, or None."""
        if self.backend is None:
            return self.lapp.backend_error or "The model store is not available."
        return None

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Every screen's failed worker reaches the one error display (subclass handlers run too)."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self.lapp.show_error(event.worker.error, doing=event.worker.name)

    def run_blocking(
        self,
        description: str,
        fn: Callable[..., Any],
        *args: Any,
        done: str | Callable[[Any], str] | None = None,
        changes_models: bool = False,
        group: str = "ops",
        exclusive: bool = False,
        **kwargs: Any,
    ) -> Worker[Any]:
        """Run ``fn`` in a thread; on return post a Notice (``done``) and ModelsChanged if asked."""
        app = self.app

        def job() -> Any:
            result = fn(*args, **kwargs)
            if done is not None:
                app.post_message(Notice(done(result) if callable(done) else done))
            if changes_models:
                app.post_message(ModelsChanged(description))
            return result

        return self.run_worker(
            job, thread=True, name=description, group=group, exclusive=exclusive, exit_on_error=False
        )
