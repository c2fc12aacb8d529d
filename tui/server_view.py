"""Server: where it listens, what is loaded (memory, idle, TTL, its prompt cache in RAM and on
disk), a live request log and a tokens/s sparkline. The log and the samples live in the app,
so nothing is lost while another screen is showing."""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import getters
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import DataTable, Sparkline, Static

from localrun.errors import LocalrunError
from localrun.tui.base import LocalrunScreen
from localrun.tui.format import cache_cell, clock, human_bytes, human_duration, sparkline_peak
from localrun.tui.metering import RequestLogEntry
from localrun.tui.tables import fit_columns

if TYPE_CHECKING:
    from localrun.settings import Settings

log = logging.getLogger(__name__)

SPARK_POINTS = 60


def mirror_line(state: Any, settings: Settings) -> str:
    """What the hub mirror (``server.mirror``) offers other machines, or how to turn it on."""
    if settings.server.mirror:
        return (
            f"Hub mirror: on · other machines set HF_ENDPOINT={state.url} (huggingface_hub, hf download, "
            "llama.cpp -hf, localrun pull)"
        )
    return (
        "Hub mirror: off · `localrun serve --mirror`, `localrun mirror` or LOCALRUN_SERVER__MIRROR=1 serves this "
        "store to other machines"
    )


def address_line(state: Any, settings: Settings) -> str:
    server = settings.server
    cors = " + ".join((["local pages"] if server.cors_local_origins else []) + list(server.cors_origins)[:3]) or "off"
    if state.mode == "embedded":
        return (
            f"Listening {state.url} · OpenAI /v1 · Ollama /api · key: {'on' if state.key else 'off'} · CORS: {cors}\n"
            + mirror_line(state, settings)
        )
    if state.mode == "attached":
        return (
            f"Attached to {state.url}: another localrun serves it; its request log is in that window. · key: "
            f"{'on' if state.key else 'off'}"
        )
    if state.mode == "starting":
        return "Starting the server…"
    return (
        f"Not serving{': ' + state.detail if state.detail else ''}. Local apps cannot reach these models until "
        "localrun serves."
    )


def speculation_note(drafted: int, accepted: int) -> str:
    """The Server screen's word on speculative decoding, over the requests in its log."""
    if not drafted:
        return ""
    return f" · drafts {100 * accepted / drafted:.0f} % kept, {accepted:,} tokens saved"


def log_cells(e: RequestLogEntry) -> tuple[str | Text, ...]:
    ttft = f"{e.ttft_s * 1000:.0f} ms" if e.ttft_s is not None else "—"
    rate = f"{e.tok_s:.1f}" if e.tok_s else "—"
    return (
        clock(e.at),
        f"{e.method} {e.route}",
        Text(e.model or "—"),
        Text(str(e.prompt_tokens), justify="right"),
        Text(str(e.completion_tokens), justify="right"),
        Text(ttft, justify="right"),
        Text(rate, justify="right"),
        Text(str(e.status), style="bold" if e.status >= 400 else ""),
    )


UPSTREAM_COLUMNS = ("Upstream", "Kind", "URL", "Health", "In flight", "Latency", "Models", "Cooldowns")
UPSTREAM_POLL_S = 2.0
_HEALTH_STYLE = {"up": "green", "cooldown": "yellow", "down": "bold red", "unknown": "dim"}


def upstream_cells(u: dict[str, Any]) -> tuple[str | Text, ...]:
    """One upstream as the Server screen's table shows it (from the pool's status dicts)."""
    latency = f"{u['latency_ms']:.0f} ms" if u.get("latency_ms") is not None else "—"
    health = u["health"] + (f" {u['cooldown_left_s']:.0f}s" if u["health"] == "cooldown" else "")
    models = ", ".join(u.get("models") or ()) or "—"
    return (
        Text(u["name"]),
        u["kind"],
        Text(u["url"]),
        Text(health, style=_HEALTH_STYLE.get(u["health"], "")),
        Text(f"{u['in_flight']}/{u['max_concurrency']}", justify="right"),
        Text(latency, justify="right"),
        Text(models if len(models) <= 40 else models[:39] + "…"),
        Text(str(u.get("cooldowns", 0)), justify="right"),
    )


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
    upstream_table = getters.query_one("#upstreams", DataTable)

    def __init__(self) -> None:
        super().__init__()
        self._per_model: Counter[str] = Counter()
        self._drafts = [0, 0]  # drafted, accepted: over the requests logged

    def compose_body(self) -> ComposeResult:
        yield Static("", id="address", markup=False)
        yield DataTable(id="loaded", cursor_type="row")
        yield DataTable(id="upstreams", cursor_type="row")
        with Horizontal(id="rate-row"):
            yield Static("tok/s ", id="rate-label")
            yield Sparkline([], id="rate")
            yield Static("", id="peak")
        yield DataTable(id="requests", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.models.add_columns(
            "Model", "Runtime", "Device", "Memory", "Idle", "TTL", "Active", "Requests", "Cache RAM", "Cache disk"
        )
        self.requests.add_columns("Time", "Route", "Model", "In", "Out", "TTFT", "tok/s", "Status")
        app = self.lapp
        for entry in app.request_log:
            self._add_entry(entry)
        app.request_signal.subscribe(self, self._add_entry)
        app.rate_signal.subscribe(self, self._new_rate)
        self._new_rate(0.0)
        self.watch(app, "server_state", self._show_address)
        self.watch(app, "loaded", self._show_loaded)
        self.upstream_table.add_columns(*UPSTREAM_COLUMNS)
        self.upstream_table.display = False
        self.set_interval(UPSTREAM_POLL_S, self._poll_upstreams)
        self._poll_upstreams()
        self.models.focus()

    def on_unmount(self) -> None:
        self.lapp.request_signal.unsubscribe(self)
        self.lapp.rate_signal.unsubscribe(self)

    def _show_address(self, state: Any) -> None:
        self.address.update(address_line(state, self.lapp.settings))

    def _show_loaded(self, loaded: Any) -> None:
        table = self.models
        keep = self._selected()
        table.clear()
        for m in loaded:
            ttl = "pinned" if m.pinned else human_duration(m.ttl_left_s)
            table.add_row(
                Text(m.name),
                m.runtime,
                m.device,
                human_bytes(m.memory_bytes),
                human_duration(m.idle_s),
                ttl,
                str(m.active),
                str(self._per_model.get(m.name, 0)),
                cache_cell(m.cache, "ram"),
                cache_cell(m.cache, "disk"),
                key=m.name,
            )
        fit_columns(table)
        if keep and keep in {m.name for m in loaded}:
            table.move_cursor(row=table.get_row_index(keep))

    def _poll_upstreams(self) -> None:
        """Read the upstreams' health in a thread; the table is filled on the event loop."""
        backend = self.backend
        if backend is None or not hasattr(backend, "upstreams"):
            return

        def job() -> None:
            try:
                rows = backend.upstreams()
            except LocalrunError as exc:
                log.debug("upstream status: %s", exc)
                return
            self.app.call_from_thread(self._show_upstreams, rows)

        self.run_worker(job, thread=True, group="upstreams", exclusive=True, name="read upstreams", exit_on_error=False)

    def _show_upstreams(self, rows: list[dict[str, Any]]) -> None:
        table = self.upstream_table
        table.display = bool(rows)
        table.clear()
        for u in rows:
            table.add_row(*upstream_cells(u), key=u["name"])
        fit_columns(table)

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
        self.run_blocking(
            f"pin {name}",
            self.backend.set_pin,
            name,
            pinned,
            changes_models=True,
            done=f"{'Pinned' if pinned else 'Unpinned'} {name}",
        )

    def action_clear_log(self) -> None:
        self.requests.clear()
        self.lapp.request_log.clear()
