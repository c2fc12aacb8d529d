"""Pulls that outlive the screen they started on.

Each pull is a thread worker owned by the app, so switching screens never stops it. The
downloader reports progress per file through a callback; the callback posts coalescing
``DownloadUpdated`` messages and is also where a cancel takes effect (it raises
``Cancelled``, the downloader stops, and the partial file stays for the next pull to
resume).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from localrun.errors import Cancelled, LocalrunError
from localrun.tui.messages import DownloadState, DownloadUpdated, ModelsChanged, Notice
from localrun.types import Cancel

if TYPE_CHECKING:
    from textual.app import App

    from localrun.modelstore.download import Progress as FileProgress
    from localrun.modelstore.store import ModelStore

log = logging.getLogger(__name__)

#: Finished pulls kept on screen, newest last.
KEEP_FINISHED = 8


class Downloads:
    """The app's pulls: start, cancel, and the states the header and Discover show."""

    def __init__(self, app: App[Any]) -> None:
        self._app = app
        self._cancels: dict[str, Cancel] = {}
        self._states: dict[str, DownloadState] = {}

    @property
    def states(self) -> tuple[DownloadState, ...]:
        return tuple(self._states.values())

    def active_refs(self) -> list[str]:
        return [ref for ref, c in self._cancels.items() if not c.is_set()]

    def start(self, ref: str, *, store: ModelStore) -> bool:
        """Pull ``ref`` into ``store`` in the background; False if it is already being pulled."""
        if ref in self._cancels:
            self._app.notify(f"{ref} is already being pulled", timeout=3)
            return False
        cancel = Cancel()
        self._cancels[ref] = cancel
        self.update(DownloadState(f"{ref}|", ref, "", status="pulling", message="listing files…"))
        app = self._app

        def job() -> None:
            try:
                self._pull(ref, store, cancel)
            finally:
                self._cancels.pop(ref, None)  # one dict operation: atomic, no hop to the UI needed

        app.run_worker(job, thread=True, group="pull", name=f"pull {ref}", exit_on_error=False)
        return True

    def _pull(self, ref: str, store: ModelStore, cancel: Cancel) -> None:
        from localrun.modelstore.pull import pull

        app = self._app
        rows: dict[str, DownloadState] = {"": DownloadState(f"{ref}|", ref, "")}

        def progress(p: FileProgress) -> None:
            if cancel.is_set():
                raise Cancelled(f"pull of {ref} cancelled", hint="pull again to resume from the bytes already on disk")
            note = {"checking": "checking the cached copy…", "waiting": "waiting for another pull of this file…"}.get(
                p.phase, ""
            )
            state = DownloadState(
                f"{ref}|{p.file}",
                ref,
                p.file,
                p.done,
                p.total,
                p.speed or None,
                "done" if p.phase == "done" else "pulling",
                note,
            )
            rows[p.file] = state
            app.post_message(DownloadUpdated(state))

        def finish_open_rows(status: str, message: str) -> None:
            for row in rows.values():
                if row.active and (row.file or len(rows) == 1):
                    app.post_message(DownloadUpdated(dataclasses.replace(row, status=status, message=message)))

        started = time.monotonic()
        try:
            record = pull(store, ref, progress=progress)
        except Cancelled:
            finish_open_rows("cancelled", "cancelled; pull again to resume")
            return
        except LocalrunError as exc:
            finish_open_rows("failed", exc.message)
            raise
        finish_open_rows("done", "")
        app.post_message(ModelsChanged(f"pulled {record.name}"))
        app.post_message(
            Notice(
                f"{ref} is in the library as {record.name} ({time.monotonic() - started:.1f} s)", title="Pull finished"
            )
        )

    def cancel(self, ref: str) -> bool:
        cancel = self._cancels.get(ref)
        if cancel is None:
            return False
        cancel.set()
        return True

    def cancel_all(self) -> None:
        for cancel in self._cancels.values():
            cancel.set()

    def update(self, state: DownloadState) -> None:
        """Fold one update in (on the app's thread) and publish the new tuple."""
        if state.file:  # the listing is read: the placeholder row gives way to the files
            self._states.pop(f"{state.ref}|", None)
        self._states[state.key] = state
        finished = [k for k, s in self._states.items() if not s.active]
        for key in finished[:-KEEP_FINISHED]:
            del self._states[key]
        self._app.downloads = self.states  # type: ignore[attr-defined]
