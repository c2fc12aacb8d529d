"""Discover: search the hub, see a repo's quants with size and fit, pull with progress.

The search box has the focus when the screen opens, so typing a query just works; a bare
``q`` here never quits (it starts a search), and Ctrl+Q asks first while a pull runs.
When the hub cannot be reached the screen says "offline" and why, within the probe's
1.5 s, instead of waiting out huggingface_hub's retries.

Pulls belong to the app (see :mod:`localrun.tui.downloads`), so they keep running when
this screen is left. Offline (``HF_HUB_OFFLINE`` or ``hub.offline``) the search covers the
local Hugging Face cache and says so; a hub that cannot be reached gets the same calm
explanation instead of an error wall.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import getters, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from localrun.errors import DownloadFailed, LocalrunError
from localrun.tui.base import LocalrunScreen
from localrun.tui.format import eta, human_bytes, human_count, human_rate, progress_bar, verdict_badge
from localrun.tui.messages import DownloadState
from localrun.tui.offers import Offer, cached_repos, offers_from_cache, offers_from_files, pulled_as
from localrun.tui.tables import fit_columns

if TYPE_CHECKING:
    from localrun.tui.backend import Backend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RepoRow:
    name: str
    downloads: int | None
    likes: int | None
    updated: str


class DiscoverScreen(LocalrunScreen):
    """Search → repo → quant → pull."""

    TAB = "discover"
    TYPE_TO = "#search"
    BINDINGS = [
        Binding("slash", "search", "Search"),
        Binding("p", "pull", "Pull"),
        Binding("x", "cancel_pull", "Cancel pull"),
        Binding("f", "focus_files", "Files", show=False),
        Binding("escape", "leave_search", "Back", show=False),
        Binding("q", "type_search('q')", show=False),  # outranks the app's quit: "qwen" is a search
        Binding("down,up", "into_results", show=False),  # from the search box: the tables take the arrows
    ]

    @dataclass
    class Found(Message, bubble=False):
        """Search results (hub or cache) and a note on where they came from."""

        query: str
        repos: list[RepoRow]
        note: str

    @dataclass
    class OffersRead(Message, bubble=False):
        repo: str
        offers: list[tuple[Offer, str | None, str | None]]  # offer, verdict, memory text

    search_input = getters.query_one("#search", Input)
    note = getters.query_one("#hub-note", Static)
    repos_table = getters.query_one("#repos", DataTable)
    files_table = getters.query_one("#files", DataTable)
    pulls_table = getters.query_one("#pull-table", DataTable)

    def __init__(self) -> None:
        super().__init__()
        self._offers: dict[str, Offer] = {}
        self._cache: dict[str, list[Any]] = {}

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="search-row"):
            yield Input(  # a key that brings the focus here (TYPE_TO) adds to the text, never replaces it
                placeholder="search the hub, e.g. qwen 0.5b gguf — enter to search", id="search", select_on_focus=False
            )
        yield Static("", id="hub-note", markup=False)
        yield DataTable(id="repos", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="files", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="pull-table", cursor_type="row", show_cursor=True)

    def on_mount(self) -> None:
        self.repos_table.add_columns("Repo", "Downloads", "Likes", "Updated")
        self.files_table.add_columns("Quant", "File", "Size", "Fit on this machine")
        self.pulls_table.add_columns("Pull", "File", "Progress", "", "Bytes", "Speed", "ETA")
        self.watch(self.app, "downloads", self._render_pulls)
        self.note.update(self.where_text())
        self.search_input.focus()
        self._check_hub()

    def on_screen_resume(self) -> None:
        if not self.repos_table.row_count:
            self.search_input.focus()

    def _check_hub(self) -> None:
        """Say at once when the hub cannot be reached, so an empty screen explains itself."""
        if self.offline():
            return
        from localrun.modelstore.hub import check_reachable, hub_endpoint

        endpoint = hub_endpoint(self.lapp.settings)

        def job() -> None:
            try:
                check_reachable(endpoint)
            except DownloadFailed as exc:
                note = self._unreachable_note(exc, len(self._cached_repos("")))
                self.app.call_from_thread(self.note.update, note)

        self.run_worker(job, thread=True, group="hub-check", exclusive=True, name="hub check", exit_on_error=False)

    @staticmethod
    def _unreachable_note(exc: DownloadFailed, on_disk: int) -> str:
        """Why the hub is out of reach, and what a search finds instead: only what is true (an
        empty HF cache is said to be empty)."""
        why = exc.message.removeprefix("offline: ")
        disk = (
            f"A search looks through the {on_disk} repo(s) in the HF cache on disk instead."
            if on_disk
            else "The HF cache on disk holds no models to search either."
        )
        return (
            f"Offline: the hub could not be reached — {why}. {disk} "
            "(HF_HUB_OFFLINE=1: offline on purpose; HF_ENDPOINT: a mirror.)"
        )

    # -- where models come from ----------------------------------------------------------
    def offline(self) -> bool:
        from localrun.modelstore.hub import hub_offline

        return hub_offline(self.lapp.settings)

    def where_text(self) -> str:
        from localrun.modelstore.hub import hub_cache_dir, hub_endpoint

        endpoint = hub_endpoint(self.lapp.settings)
        if self.offline():
            return (
                f"offline — searching the models on disk (HF cache at {hub_cache_dir()})"
                f"{'' if endpoint.endswith('huggingface.co') else f' and the mirror at {endpoint}'}. "
                "Unset HF_HUB_OFFLINE to search the hub."
            )
        return f"hub: {endpoint}"

    # -- search --------------------------------------------------------------------------
    def action_search(self) -> None:
        self.search_input.focus()

    def action_type_search(self, char: str) -> None:
        """A letter typed while a table has the keys goes to the search box, never to quit."""
        box = self.search_input
        box.focus()
        box.insert_text_at_cursor(char)

    @on(Input.Changed, "#search")
    def _slash_opens_search(self, event: Input.Changed) -> None:
        if event.value == "/":  # "/" is the key that opens search; it is not part of a query
            self.search_input.value = ""

    def action_into_results(self) -> None:
        """↓/↑ in the search box: the results take the keys (and the next arrow moves the selection)."""
        table = self.repos_table if self.repos_table.row_count else None
        if table is None:
            self.notify("No results yet: type a search and press enter", timeout=2)
            return
        table.focus()

    def action_leave_search(self) -> None:
        """Esc hands the keys back to the tables, where 1–5 switch screens again."""
        self.repos_table.focus()

    @on(Input.Submitted, "#search")
    def _submitted(self, event: Input.Submitted) -> None:
        self.run_search(event.value.strip())

    def run_search(self, query: str) -> None:
        settings = self.lapp.settings
        offline = self.offline()
        self.note.update(f"searching {'the local cache' if offline else 'the hub'} for {query!r}…")

        def job() -> None:
            if offline:
                self.post_message(self.Found(query, *self._search_cache(query)))
                return
            from localrun.modelstore.hub import search

            try:
                hits = search(query, settings=settings, limit=30)
            except DownloadFailed as exc:  # unreachable hub: explain, offer the cache, no error wall
                repos, _ = self._search_cache(query)
                self.post_message(self.Found(query, repos, self._unreachable_note(exc, len(self._cached_repos("")))))
                return
            rows = [
                RepoRow(h.name, h.downloads, h.likes, h.updated.strftime("%Y-%m") if h.updated else "—") for h in hits
            ]
            self.post_message(self.Found(query, rows, self.where_text()))

        self.run_worker(job, thread=True, group="search", exclusive=True, name=f"search {query!r}", exit_on_error=False)

    @staticmethod
    def _cached_repos(query: str) -> dict[str, list[Any]]:
        from localrun.modelstore.sources.hf_cache import discover_hf_cache

        return cached_repos(discover_hf_cache(read_metadata=False), query)

    def _search_cache(self, query: str) -> tuple[list[RepoRow], str]:
        self._cache = self._cached_repos(query)
        rows = [RepoRow(repo, None, None, "on disk") for repo in sorted(self._cache)]
        return rows, self.where_text()

    def on_discover_screen_found(self, message: Found) -> None:
        self.note.update(message.note if message.repos else f"Nothing matches {message.query!r}. {message.note}")
        table = self.repos_table
        table.clear()
        for r in message.repos:
            table.add_row(
                Text(r.name),
                Text(human_count(r.downloads), justify="right"),
                Text(human_count(r.likes), justify="right"),
                r.updated,
                key=r.name,
            )
        fit_columns(table)
        self.files_table.clear()
        if message.repos:
            table.focus()

    # -- a repo's files --------------------------------------------------------------------
    @on(DataTable.RowHighlighted, "#repos")
    def _repo_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value:
            self.read_offers(event.row_key.value)

    @on(DataTable.RowSelected, "#repos")
    def _repo_selected(self, event: DataTable.RowSelected) -> None:
        self.action_focus_files()

    def read_offers(self, repo: str) -> None:
        settings, backend, cached = self.lapp.settings, self.backend, self._cache.get(repo)

        def job() -> None:
            if cached is not None:
                offers = offers_from_cache(repo, cached)
            else:
                from localrun.modelstore.hub import HubClient

                listing = HubClient(settings=settings).list_repo(repo)
                offers = offers_from_files(repo, {f.path: f.size for f in listing.files})
            self.post_message(self.OffersRead(repo, [(o, *_fit(backend, o)) for o in offers]))

        self.run_worker(job, thread=True, group="offers", exclusive=True, name=f"list {repo}", exit_on_error=False)

    def on_discover_screen_offers_read(self, message: OffersRead) -> None:
        table = self.files_table
        table.clear()
        self._offers = {}
        theme = self.app.theme_variables
        for offer, verdict, memory in message.offers:
            self._offers[offer.ref] = offer
            name = offer.file + (f" (+{offer.parts - 1} parts)" if offer.parts > 1 else "")
            badge = verdict_badge(verdict, theme) if verdict else Text("? unknown", style="dim")
            if memory:
                badge.append(f" ({memory})", style="dim")
            table.add_row(
                Text(offer.quant), Text(name), Text(human_bytes(offer.size), justify="right"), badge, key=offer.ref
            )
        fit_columns(table)
        if not message.offers:
            self.note.update(f"{message.repo} holds no GGUF, MLX or MLC model localrun can run.")

    def action_focus_files(self) -> None:
        self.files_table.focus()

    # -- pulls -----------------------------------------------------------------------------
    def _highlighted_ref(self) -> str | None:
        if self.files_table.has_focus and self.files_table.row_count:
            return self.files_table.coordinate_to_cell_key(self.files_table.cursor_coordinate).row_key.value
        if self.repos_table.row_count and not self.pulls_table.has_focus:
            return self.repos_table.coordinate_to_cell_key(self.repos_table.cursor_coordinate).row_key.value
        return None

    @on(DataTable.RowSelected, "#files")
    def _file_selected(self) -> None:
        self.action_pull()

    def action_pull(self) -> None:
        ref = self._highlighted_ref()
        if ref is None:
            self.notify("Search, then pick a repo or a file to pull", severity="warning", timeout=3)
            return
        if self.lapp.store is None:
            self.notify(self.unavailable_text() or "", severity="warning")
            return
        if (have := pulled_as(self.lapp.store.list(), ref)) is not None:
            self.notify(
                f"{ref} is already in the library as {have} (press 1 to see it; pick another file with f)",
                title="Already pulled",
                timeout=4,
            )
            return
        if self.lapp.pulls.start(ref, store=self.lapp.store):
            self.notify(f"Pulling {ref}; it keeps going on other screens (x cancels)", timeout=3)

    def action_cancel_pull(self) -> None:
        refs = self.lapp.pulls.active_refs()
        if not refs:
            self.notify("No pull is running", timeout=2)
            return
        chosen = None
        if self.pulls_table.row_count and self.pulls_table.has_focus:
            key = self.pulls_table.coordinate_to_cell_key(self.pulls_table.cursor_coordinate).row_key.value or ""
            chosen = key.split("|")[0]
        ref = chosen if chosen in refs else refs[-1]
        self.lapp.pulls.cancel(ref)
        self.notify(f"Cancelling {ref}…", timeout=2)

    def _render_pulls(self, downloads: tuple[DownloadState, ...]) -> None:
        table = self.pulls_table
        table.clear()
        for d in downloads:
            pct = f"{d.fraction * 100:3.0f} %" if d.total else ""
            status = progress_bar(d.fraction) if d.active and d.total else (d.message or d.status)
            size = f"{human_bytes(d.done)}/{human_bytes(d.total)}" if d.total else ""
            table.add_row(
                Text(d.ref),
                Text(d.file or d.message),
                Text(status),
                pct,
                size,
                human_rate(d.rate) if d.active else "",
                eta(d.done, d.total, d.rate) if d.active else d.status,
                key=d.key,
            )
        fit_columns(table)


def _fit(backend: Backend | None, offer: Offer) -> tuple[str | None, str | None]:
    """The planner's verdict for a file not downloaded yet, from its size and quant."""
    if backend is None or not getattr(backend, "can_plan", False):
        return None, None
    try:
        plan = backend.plan(offer.record())
    except LocalrunError as exc:
        log.info("no fit estimate for %s: %s", offer.ref, exc)
        return None, None
    if plan is None:
        return None, None
    memory = f"{human_bytes(plan.memory.total)} with {plan.n_ctx // 1024}k ctx" if plan.memory else None
    return plan.verdict, memory
