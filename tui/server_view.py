"""Server: where it listens, what is loaded (memory, idle, TTL), a live request log and a
tokens/s sparkline. The log and the samples live in the app, so nothing is lost while
another screen is showing."""

from __future__ import annotations

import logging
from collections import Counter

from rich.text import Text
from textual import getters
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import DataTable, Sparkline, Static

from localrun.tui.base import LocalrunScreen
from localrun.tui.format import clock, human_bytes, human_duration, sparkline_peak
from localrun.tui.metering import RequestLogEntry
from localrun.tui.tables import fit_columns

log = logging.getLogger(__name__)

SPARK_POINTS = 60


def address_line(state, settings) -> str:
    cors = "on" if settings.server.cors_origins else "off"
    if state.mode == "embedded":
        return f"Listening {state.url} · OpenAI /v1 · Ollama /api · key: {'on' if state.key else 'off'} · CORS: {cors}"
    if state.mode == "attached":
        return f"Attached to {state.url}: another localrun serves it; its request log is in that window. · key: {'on' if state.key else 'off'}"
    if state.mode == "starting":
        return "Starting the server…"
    return f"Not serving{': ' + state.detail if state.detail else ''}. Local apps cannot reach these models until localrun serves."


def speculation_note(drafted: int, accepted: int) -> str:
    """The Server screen's word on speculative decoding, over the requests in its log."""
    if not drafted:
        return ""
    return f" · drafts {100 * accepted / drafted:.0f} % kept, {accepted:,} tokens saved"


def log_cells(e: RequestLogEntry) -> tuple:
    ttft = f"{e.ttft_s * 1000:.0f} ms" if e.ttft_s is not None else "—"
    rate = f"{e.tok_s:.1f}" if e.tok_s else "—"
    return (clock(e.at), f"{e.method} {e.route}", Text(e.model or "—"), Text(str(e.prompt_tokens), justify="right"),
            Text(str(e.completion_tokens), justify="right"), Text(ttft, justify="right"), Text(rate, justify="right"),
            Text(str(e.status), style="bold" if e.status >= 400 else ""))


class ServerScreen(LocalrunScreen):
    TAB = "server"
    BINDINGS = [
        Binding("u", "unload", "Unload"),
        Binding("p", "pin", "Pin"),
        Binding("c", "clear_log", "Clear log"),
    ]

    address = getters.query_one("#address", Static)
    models = getters.query_one("#loaded", DataTable)
    spark = getters.query_one("#rate", Sparkline)
    peak = getters.query_one("#peak", Static)
    requests = getters.query_one("#requests", DataTable)

    def __init__(self) -> None:
        super().__init__()
        self._per_model: Counter[str] = Counter()
        self._drafts = [0, 0]  # drafted, accepted: over the requests logged

    def compose_body(self) -> ComposeResult:
        yield Static("", id="address", markup=False)
        yield DataTable(id="loaded", cursor_type="row")
        with Horizontal(id="rate-row"):
            yield Static("tok/s ", id="rate-label")
            yield Sparkline([], id="rate")
            yield Static("", id="peak")
        yield DataTable(id="requests", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.models.add_columns("Model", "Runtime", "Device", "Memory", "Idle", "TTL", "Active", "Requests")
        self.requests.add_columns("Time", "Route", "Model", "In", "Out", "TTFT", "tok/s", "Status")
        app = self.lapp
        for entry in app.request_log:
            self._add_entry(entry)
        app.request_signal.subscribe(self, self._add_entry)
        app.rate_signal.subscribe(self, self._new_rate)
        self._new_rate(0.0)
        self.watch(app, "server_state", self._show_address)
        self.watch(app, "loaded", self._show_loaded)
        self.models.focus()

    def on_unmount(self) -> None:
        self.lapp.request_signal.unsubscribe(self)
        self.lapp.rate_signal.unsubscribe(self)

    def _show_address(self, state) -> None:
        self.address.update(address_line(state, self.lapp.settings))

    def _show_loaded(self, loaded) -> None:
        table = self.models
        keep = self._selected()
        table.clear()
        for m in loaded:
            ttl = "pinned" if m.pinned else human_duration(m.ttl_left_s)
            table.add_row(Text(m.name), m.runtime, m.device, human_bytes(m.memory_bytes), human_duration(m.idle_s), ttl,
                          str(m.active), str(self._per_model.get(m.name, 0)), key=m.name)
        fit_columns(table)
        if keep and keep in {m.name for m in loaded}:
            table.move_cursor(row=table.get_row_index(keep))

    def _add_entry(self, entry: RequestLogEntry) -> None:
        if entry.model:
            self._per_model[entry.model] += 1
        if entry.drafted_tokens:
            self._drafts[0] += entry.drafted_tokens
            self._drafts[1] += entry.accepted_tokens
            self._new_rate(0.0)
        table = self.requests
        key = table.add_row(*log_cells(entry))
        fit_columns(table, [key])
        if table.row_count > 500:
            table.remove_row(next(iter(table.rows)))
        table.move_cursor(row=table.row_count - 1, animate=False)

    def _new_rate(self, _rate: float) -> None:
        samples = list(self.lapp.token_rates)[-SPARK_POINTS:]
        self.spark.data = samples
        note = speculation_note(*self._drafts)
        self.peak.update((f" {samples[-1]:.1f} tok/s · {sparkline_peak(samples)}" if samples else "") + note)

    def _selected(self) -> str | None:
        t = self.models
        if not t.row_count:
            return None
        return t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value

    def action_unload(self) -> None:
        name = self._selected()
        if name is None or self.backend is None:
            self.notify("No loaded model selected", severity="warning", timeout=3)
            return
        self.run_blocking(f"unload {name}", self.backend.unload, name, done=f"Unloaded {name}", changes_models=True)

    def action_pin(self) -> None:
        name = self._selected()
        if name is None or self.backend is None:
            self.notify("No loaded model selected", severity="warning", timeout=3)
            return
        pinned = not next((m.pinned for m in self.lapp.loaded if m.name == name), False)
        self.run_blocking(f"pin {name}", self.backend.set_pin, name, pinned, changes_models=True,
                          done=f"{'Pinned' if pinned else 'Unpinned'} {name}")

    def action_clear_log(self) -> None:
        self.requests.clear()
        self.lapp.request_log.clear()
