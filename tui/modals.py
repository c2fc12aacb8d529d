"""Small modal screens: confirm a destructive action, choose what to do about a busy port."""

from __future__ import annotations

import logging

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label

log = logging.getLogger(__name__)

MODAL_CSS = """
ConfirmModal, PortModal { align: center middle; }
ConfirmModal > Vertical, PortModal > Vertical {
    width: 64; max-width: 95%; height: auto; padding: 1 2;
    border: thick $primary; background: $surface;
}
ConfirmModal Label, PortModal Label { width: 100%; }  /* wrap a long name or question, never cut it */
ConfirmModal .title, PortModal .title { text-style: bold; margin-bottom: 1; }
ConfirmModal Horizontal, PortModal Horizontal { height: auto; margin-top: 1; align-horizontal: right; }
ConfirmModal Button, PortModal Button { margin-left: 1; }
"""


class ConfirmModal(ModalScreen[bool]):
    """Yes or no; answers True only on an explicit yes."""

    DEFAULT_CSS = MODAL_CSS
    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, title: str, question: str, *, yes: str = "Delete") -> None:
        super().__init__()
        self._title, self._question, self._yes = title, question, yes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self._title, classes="title", markup=False)
            yield Label(self._question, markup=False)
            with Horizontal():
                yield Button("Cancel (n)", id="no")
                yield Button(f"{self._yes} (y)", id="yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class PortModal(ModalScreen[int | None]):
    """The configured port is held by another program: serve on a free one, or not at all."""

    DEFAULT_CSS = MODAL_CSS
    BINDINGS = [Binding("escape", "dismiss(None)", "Don't serve")]

    def __init__(self, detail: str, free_port: int | None) -> None:
        super().__init__()
        self._detail, self._free = detail, free_port

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("The server port is taken", classes="title")
            yield Label(self._detail, markup=False)
            hint = (
                f"localrun can serve on port {self._free} instead (set LOCALRUN_SERVER__PORT to make it stick)."
                if self._free
                else "No free port was found nearby; set LOCALRUN_SERVER__PORT."
            )
            yield Label(hint + " Everything else works without serving.", markup=False)
            with Horizontal():
                yield Button("Don't serve", id="off")
                if self._free:
                    yield Button(f"Serve on {self._free}", id="use", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#use" if self._free else "#off", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(self._free if event.button.id == "use" else None)
