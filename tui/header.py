"""The frame's top: where the server listens, key state, what is loaded, the machine, the tabs.

One widget, composed by every screen, fed by the app's reactive state (it watches the
app, so a screen never has to pass anything down). Tabs are clickable and numbered, so
mouse and keyboard both reach every screen.
"""

from __future__ import annotations

import logging
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Static

from localrun.planning.hardware import fmt_bytes
from localrun.tui.format import human_bytes

log = logging.getLogger(__name__)

#: (mode name, label), in the order of their number keys.
TABS: tuple[tuple[str, str], ...] = (
    ("library", "Library"),
    ("discover", "Discover"),
    ("hardware", "Hardware"),
    ("server", "Server"),
    ("chat", "Chat"),
)


class AppHeader(Widget):
    """Two lines: the status line and the tab row (with the pulls in progress on the right)."""

    DEFAULT_CSS = """
    AppHeader {
        dock: top;
        height: 2;
        background: $panel;
        color: $foreground;
    }
    AppHeader #header-status { height: 1; width: 1fr; text-style: bold; padding: 0 1; }
    AppHeader #header-tabs-row { height: 1; overflow: hidden hidden; }
    AppHeader #header-tabs { width: 1fr; padding: 0 1; }
    AppHeader #header-pulls { width: auto; padding: 0 1; color: $accent; }
    """

    def __init__(self, active: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.active = active

    def compose(self) -> ComposeResult:
        yield Static(id="header-status", markup=False)
        with Horizontal(id="header-tabs-row"):
            yield Static(self._tabs(), id="header-tabs")
            yield Static("", id="header-pulls")

    def on_mount(self) -> None:
        app = self.app
        for name in ("server_state", "loaded", "facts", "downloads"):
            self.watch(app, name, self._refresh_status, init=False)
        self.watch(self.screen, "focused", self._refresh_tabs)
        self._refresh_status()

    def _refresh_tabs(self, *_args: object) -> None:
        self.query_one("#header-tabs", Static).update(self._tabs())

    def _tabs(self) -> Content:
        """The tabs, each with the key that reaches it now: 1–5, or F1–F5 while typed digits are text."""
        digits = getattr(self.screen, "digits_switch", lambda: True)() if self.is_attached else True
        parts = []
        for number, (mode, label) in enumerate(TABS, 1):
            text = f" {'' if digits else 'F'}{number} {label} "
            style = "reverse bold" if mode == self.active else "dim"
            parts.append(Content.from_markup(f"[@click=app.switch_mode('{mode}')][{style}]$text[/][/]", text=text))
        return Content(" ").join(parts)

    def status_text(self, width: int = 200) -> str:
        """The status line; a shorter wording when the terminal is narrow (80 columns)."""
        app = self.app
        state = getattr(app, "server_state", None)
        serving = state is not None and state.mode in ("embedded", "attached")
        loaded = getattr(app, "loaded", None) or ()
        mem = sum(m.memory_bytes or 0 for m in loaded)
        facts = getattr(app, "facts", None)
        hw = facts[0] if facts is not None else None
        gpu = ""
        if hw is not None and getattr(hw, "gpus", None):
            gpu = f" · {hw.gpus[0].name}"
        elif hw is not None and getattr(hw, "apple", None):
            gpu = f" · {hw.apple.chip}"
        key = ("on" if state.key else "off") if serving and state is not None else None
        full = ["localrun", state.label if state else "…"]
        full += [f"key: {key}"] if key else []
        full.append(f"{len(loaded)} loaded" + (f" · {human_bytes(mem)}" if mem else ""))
        full += [f"CPU {hw.physical_cores}c · RAM {fmt_bytes(hw.ram_total)}{gpu}"] if hw is not None else []
        text = " ─ ".join(full)
        if len(text) + 2 <= width:
            return text
        short = [state.label if state else "…"] + ([f"key {key}"] if key else [])
        short.append(f"{len(loaded)} loaded" + (f" {human_bytes(mem)}" if mem else ""))
        short += [f"{hw.physical_cores}c {fmt_bytes(hw.ram_total)}"] if hw is not None else []
        return " · ".join(short)

    def on_resize(self) -> None:
        self._refresh_status()

    def _refresh_status(self, *_args: object) -> None:
        self.query_one("#header-status", Static).update(self.status_text(self.size.width or 200))
        pulling = {d.ref for d in (getattr(self.app, "downloads", ()) or ()) if d.active}
        pulls = self.query_one("#header-pulls", Static)
        pulls.update(f"↓ {len(pulling)} pulling" if pulling else "")
        pulls.display = bool(pulling)
