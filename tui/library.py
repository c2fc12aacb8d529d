"""Library: the models on disk, whether each fits, what is loaded; load, unload, pin,
delete and verify, and a details pane with the GGUF metadata and the plan with its reasons.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import DataTable, Input, Static
from textual.worker import Worker, WorkerState

from localrun.errors import LocalrunError
from localrun.tui.backend import LoadedInfo, ModelDetails
from localrun.tui.base import LocalrunScreen
from localrun.tui.format import human_bytes, human_duration, verdict_badge
from localrun.tui.modals import ConfirmModal
from localrun.tui.tables import fit_columns
from localrun.types import ModelRecord, Plan

if TYPE_CHECKING:
    from localrun.tui.backend import Backend

log = logging.getLogger(__name__)

COLUMNS = ("Name", "Format", "Quant", "Size", "Runtime", "Fit", "State", "Source")


@dataclass(frozen=True)
class LibraryRow:
    """A model and its plan (or why there is none)."""

    record: ModelRecord
    plan: Plan | None
    plan_error: str | None = None
    #: What the Source column shows: the store's source, or ``upstream NAME (health)`` (the catalog's label).
    source: str = ""
    #: What the model can do ("completion", "vision", "tools"…): the catalog's answer, as ``ls`` and /api/show give it.
    capabilities: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def quant(self) -> str:
        return str(self.record.metadata.get("quant") or "—")

    @property
    def runtime(self) -> str:
        return self.plan.runtime if self.plan else "—"

    @property
    def verdict(self) -> str | None:
        return self.plan.verdict if self.plan else None

    @property
    def format_text(self) -> str:
        """The format and what the model can do beyond plain completion (``gguf · vision · tools``)."""
        return " · ".join((self.record.format.value, *(c for c in self.capabilities if c != "completion")))

    def matches(self, needle: str) -> bool:
        hay = " ".join((self.name, self.format_text, self.quant, self.runtime, self.source)).lower()
        return all(word in hay for word in needle.lower().split())


_VERDICT_ORDER = {"fits": 0, "tight": 1, "wont-fit": 2}
SORT_KEYS: dict[str, Callable[[LibraryRow], Any]] = {
    "Name": lambda r: r.name,
    "Format": lambda r: (r.record.format.value, r.name),
    "Quant": lambda r: (r.quant, r.name),
    "Size": lambda r: r.record.size,
    "Runtime": lambda r: (r.runtime, r.name),
    "Fit": lambda r: (_VERDICT_ORDER.get(r.verdict or "", 3), r.name),
    "Source": lambda r: (r.source, r.name),
}


def read_rows(backend: Backend) -> list[LibraryRow]:
    """Every model with its plan; a model the planner refuses keeps its row, with the reason."""
    rows = []
    for entry in backend.catalog():
        caps = entry.capabilities  # worked out by the catalog, off the UI thread
        try:
            rows.append(LibraryRow(entry.record, backend.plan(entry.record), source=entry.source, capabilities=caps))
        except LocalrunError as exc:
            rows.append(LibraryRow(entry.record, None, str(exc), source=entry.source, capabilities=caps))
    return rows


class LibraryScreen(LocalrunScreen):
    """Models on disk; every action on the highlighted row."""

    TAB = "library"
    TYPE_TO = "#filter"
    BINDINGS = [
        Binding("l", "load", "Load"),
        Binding("u", "unload", "Unload"),
        Binding("p", "pin", "Pin"),
        Binding("d", "delete", "Delete"),
        Binding("v", "verify", "Verify"),
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
        Binding("r", "reload", "Refresh", show=False),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("down,up", "into_table", show=False),  # from the filter: the table takes the arrows
    ]

    @dataclass
    class RowsRead(Message, bubble=False):
        """The model list and its plans were read (in a thread)."""

        rows: list[LibraryRow]

    @dataclass
    class DetailsRead(Message, bubble=False):
        details: ModelDetails

    table = getters.query_one("#models", DataTable)
    filter_input = getters.query_one("#filter", Input)
    details_pane = getters.query_one("#details", Static)

    def __init__(self) -> None:
        super().__init__()
        self._rows: list[LibraryRow] = []
        self._busy: dict[str, str] = {}  # name -> "loading…", "deleting…"
        self._sort = "Name"
        self._sort_reverse = False

    def compose_body(self) -> ComposeResult:
        yield Input(
            placeholder="/ filter by name, format, quant, runtime or source", id="filter", select_on_focus=False
        )  # a key that brings the focus here (TYPE_TO) adds to the text, never replaces it
        yield DataTable(id="models", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="details-scroll"):
            yield Static("Select a model to see its metadata and plan.", id="details", markup=False)

    def on_mount(self) -> None:
        for col in COLUMNS:
            self.table.add_column(col, key=col)
        self.watch(self.app, "loaded", self._on_loaded, init=False)
        self.watch(self.app, "models_version", self._on_models_version, init=False)
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._render_rows())  # badges take theme colours
        self.table.focus()
        self.action_reload()

    # -- reading -------------------------------------------------------------------------
    def action_reload(self) -> None:
        why = self.unavailable_text()
        backend = self.backend
        if why or backend is None:
            self.details_pane.update(why or "")
            return

        def job() -> None:
            self.post_message(LibraryScreen.RowsRead(read_rows(backend)))

        self.run_worker(job, thread=True, name="read models", group="read", exclusive=True, exit_on_error=False)

    def _on_models_version(self, _version: int) -> None:
        self.action_reload()

    def on_library_screen_rows_read(self, message: RowsRead) -> None:
        self._rows = message.rows
        self._render_rows()

    def _on_loaded(self, loaded: tuple[LoadedInfo, ...]) -> None:
        """Idle clocks tick every poll: touch only the State cells, so the cursor, the scroll
        position and the details pane stay as they are."""
        table = self.table
        by_name = {m.name: m for m in loaded}
        for row in self.visible_rows():
            if row.name in table.rows:
                table.update_cell(row.name, "State", self._state_cell(row.name, by_name))
        fit_columns(table, list(by_name) + list(self._busy), columns=("State",))

    def _state_cell(self, name: str, loaded: dict[str, LoadedInfo]) -> Text:
        if name in self._busy:
            return Text(self._busy[name], style="italic")
        info = loaded.get(name)
        if info is None:
            return Text("—", style="dim")
        idle = f" idle {human_duration(info.idle_s)}" if info.idle_s else ""
        word = "pinned" if info.pinned else "loaded"
        return Text(f"{word}{idle}" if not info.active else f"{word} · busy", style="bold")

    def visible_rows(self) -> list[LibraryRow]:
        needle = self.filter_input.value.strip()
        rows = [r for r in self._rows if not needle or r.matches(needle)]
        return sorted(rows, key=SORT_KEYS.get(self._sort, SORT_KEYS["Name"]), reverse=self._sort_reverse)

    def _render_rows(self) -> None:
        table = self.table
        keep = self.selected_name()
        loaded = {m.name: m for m in (self.lapp.loaded or ())}
        theme = self.app.theme_variables
        table.clear()
        for row in self.visible_rows():
            rec = row.record
            table.add_row(
                Text(row.name),
                row.format_text,
                Text(row.quant),
                Text(human_bytes(rec.size), justify="right"),
                row.runtime,
                verdict_badge(row.verdict, theme) if row.plan else Text("? no plan", style="dim"),
                self._state_cell(row.name, loaded),
                row.source,
                key=row.name,
            )
        fit_columns(table)
        if keep is not None and keep in {r.name for r in self.visible_rows()}:
            table.move_cursor(row=table.get_row_index(keep))
        if not self._rows:
            self.details_pane.update(
                "No models yet. Press 2 to discover and pull one, or run `localrun import FILE.gguf`."
            )

    def selected_name(self) -> str | None:
        table = self.table
        if table.row_count == 0:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        except LookupError:
            return None
        return key.value

    # -- details -------------------------------------------------------------------------
    @on(DataTable.RowHighlighted, "#models")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        name = event.row_key.value if event.row_key else None
        if name is None or self.backend is None:
            return
        backend = self.backend
        screen = self

        def job() -> None:
            screen.post_message(LibraryScreen.DetailsRead(backend.details(name)))

        self.run_worker(
            job, thread=True, name=f"details of {name}", group="details", exclusive=True, exit_on_error=False
        )

    def on_library_screen_details_read(self, message: DetailsRead) -> None:
        d = message.details
        # The plan and its reasons first (what people act on), then the GGUF metadata.
        self.details_pane.update("\n".join((*d.plan_lines, "", *d.metadata_lines)))

    @on(DataTable.HeaderSelected, "#models")
    def _header_clicked(self, event: DataTable.HeaderSelected) -> None:
        col = str(event.column_key.value)
        if col in SORT_KEYS:
            self._sort_reverse = not self._sort_reverse if self._sort == col else col == "Size"
            self._sort = col
            self._render_rows()

    def action_sort(self) -> None:
        order = list(SORT_KEYS)
        self._sort = order[(order.index(self._sort) + 1) % len(order)]
        self._sort_reverse = self._sort == "Size"
        self.notify(f"sorted by {self._sort}", timeout=2)
        self._render_rows()

    # -- filter --------------------------------------------------------------------------
    def action_filter(self) -> None:
        self.filter_input.focus()

    def action_into_table(self) -> None:
        self.table.focus()

    def action_clear_filter(self) -> None:
        self.filter_input.value = ""
        self.table.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self) -> None:
        self._render_rows()

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        self.table.focus()

    # -- actions -------------------------------------------------------------------------
    def _target(self) -> str | None:
        if self.backend is None:
            self.notify(self.unavailable_text() or "", severity="warning")
            return None
        name = self.selected_name()
        if name is None:
            self.notify("No model selected", severity="warning", timeout=3)
        return name

    def _start(
        self, name: str, busy: str, description: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Worker[Any]:
        self._busy[name] = busy
        self._render_rows()
        return self.run_blocking(description, fn, *args, changes_models=True, group=f"model:{name}", **kwargs)

    def action_load(self) -> None:
        if name := self._target():
            self._start(name, "loading…", f"load {name}", self.need_backend().load, name, done=f"Loaded {name}")

    def action_unload(self) -> None:
        if name := self._target():
            self._start(
                name,
                "unloading…",
                f"unload {name}",
                self.need_backend().unload,
                name,
                done=lambda ok: f"Unloaded {name}" if ok else f"{name} was not loaded",
            )

    def action_pin(self) -> None:
        if not (name := self._target()):
            return
        info = next((m for m in self.lapp.loaded or () if m.name == name), None)
        pinned = not (info is not None and info.pinned)
        self._start(
            name,
            "pinning…" if pinned else "unpinning…",
            f"pin {name}",
            self.need_backend().set_pin,
            name,
            pinned,
            done=f"Pinned {name}: it stays loaded" if pinned else f"Unpinned {name}: it unloads when idle",
        )

    def action_delete(self) -> None:
        if not (name := self._target()):
            return
        row = next((r for r in self._rows if r.name == name), None)
        owned = row is not None and row.record.owned
        what = (
            "Its files were downloaded by localrun and will be deleted."
            if owned
            else "Its files stay on disk (localrun did not download them); only the entry goes."
        )

        def answered(yes: bool | None) -> None:
            if yes:
                delete = self.need_backend().delete
                self._start(name, "deleting…", f"delete {name}", delete, name, done=f"Deleted {name}")

        self.app.push_screen(ConfirmModal(f"Delete {name}?", what), answered)

    def action_verify(self) -> None:
        if name := self._target():
            verify = self.need_backend().verify
            self._start(name, "verifying…", f"verify {name}", verify, name, done=lambda r: r.message)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Clear a row's busy mark when its job ends; the app's handler shows any error."""
        group = event.worker.group or ""
        if group.startswith("model:") and event.state in (
            WorkerState.SUCCESS,
            WorkerState.ERROR,
            WorkerState.CANCELLED,
        ):
            self._busy.pop(group.removeprefix("model:"), None)
            self._render_rows()
