"""Hardware: the machine's profile, and each runtime with its status, the reason and the fix."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from localrun.tui.base import LocalrunScreen
from localrun.tui.tables import fit_columns

if TYPE_CHECKING:
    from localrun.planning.hardware import HardwareProfile

log = logging.getLogger(__name__)


def profile_lines(hw: HardwareProfile, statuses: Mapping[str, Any] | None = None) -> list[str]:
    """The hardware module's own lines, and the llama.cpp build's backend, so the CLI and the TUI say the same."""
    from localrun.planning.facts import backend_lines
    from localrun.planning.hardware import hardware_lines

    return [str(line) for line in hardware_lines(hw)] + backend_lines(statuses or {})


class HardwareScreen(LocalrunScreen):
    TAB = "hardware"
    BINDINGS = [Binding("r", "redetect", "Detect again")]

    profile = getters.query_one("#profile", Static)
    runtimes = getters.query_one("#runtimes", DataTable)
    why = getters.query_one("#runtime-why", Static)

    def compose_body(self) -> ComposeResult:
        yield Static("detecting hardware…", id="profile", markup=False)
        yield DataTable(id="runtimes", cursor_type="row", zebra_stripes=True)
        yield Static("", id="runtime-why", markup=False)

    def on_mount(self) -> None:
        self.runtimes.add_columns("Runtime", "Status", "Version", "Devices", "Why / how to get it")
        self.watch(self.app, "facts", self._show)
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._show(self.lapp.facts))
        self.runtimes.focus()

    def _show(self, facts: Any) -> None:
        if facts is None:
            return
        hw, statuses = facts
        self.profile.update("\n".join(profile_lines(hw, statuses)))
        theme = self.app.theme_variables
        table = self.runtimes
        table.clear()
        from localrun.planning.facts import status_cells

        for name, st in statuses.items():
            ok = st.available
            status = Text("● ready" if ok else "✕ unavailable", style=theme.get("success" if ok else "error", ""))
            version, devices, why = status_cells(st)
            table.add_row(Text(name), status, version, devices, Text(why or "—"), key=name)
        fit_columns(table)

    @on(DataTable.RowHighlighted, "#runtimes")
    def _explain(self, event: DataTable.RowHighlighted) -> None:
        """The whole reason and fix of the highlighted runtime, wrapped (the table cuts them at 80 columns)."""
        facts = self.lapp.facts
        name = event.row_key.value if event.row_key else None
        if facts is None or name not in facts[1]:
            return
        st = facts[1][name]
        lines = [f"{name}: {'ready' if st.available else 'unavailable'}" + (f" — {st.reason}" if st.reason else "")]
        if st.fix:
            lines.append(f"to get it: {st.fix}")
        self.why.update("\n".join(lines))

    def action_redetect(self) -> None:
        self.profile.update("detecting hardware…")
        self.lapp.detect_facts(refresh=True)
