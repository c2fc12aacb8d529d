"""App-wide messages and the small state records they carry.

Thread workers post these to the app (``post_message`` is the one thread-safe door); the
app folds them into its reactive state, and screens watch that state. Messages that
belong to one widget are nested in that widget instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message

from localrun.tui.backend import LoadedInfo
from localrun.tui.metering import RequestLogEntry


@dataclass(frozen=True)
class ServerState:
    """What the header and the server screen say about serving."""

    mode: str = "starting"  # starting | embedded | attached | off | failed
    url: str | None = None
    key: bool = False
    detail: str = ""

    @property
    def label(self) -> str:
        if self.mode in ("embedded", "attached") and self.url:
            return self.url + (" (attached)" if self.mode == "attached" else "")
        return {"starting": "starting server…", "off": "not serving", "failed": "server failed"}.get(
            self.mode, self.mode
        )


@dataclass(frozen=True)
class DownloadState:
    """One pull as the header and the discover screen show it."""

    key: str  # "<ref>|<file>": one row per file of a pull
    ref: str  # what was pulled (org/repo, org/repo:QUANT, org/repo/file.gguf)
    file: str  # "" until the listing is read
    done: int = 0
    total: int | None = None
    rate: float | None = None  # bytes/s
    status: str = "pulling"  # pulling | done | failed | cancelled
    message: str = ""

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0

    @property
    def active(self) -> bool:
        return self.status == "pulling"


@dataclass
class LoadedChanged(Message, bubble=False):
    """The set of loaded models (or their idle times) changed."""

    loaded: tuple[LoadedInfo, ...]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadedChanged)


@dataclass
class ModelsChanged(Message, bubble=False):
    """Models were added, removed, loaded or unloaded: lists should be read again."""

    reason: str = ""


@dataclass
class FactsReady(Message, bubble=False):
    """Hardware detection and runtime probes finished (they take a moment)."""

    hardware: Any
    statuses: dict[str, Any] = field(default_factory=dict)


@dataclass
class ServerChanged(Message, bubble=False):
    state: ServerState


@dataclass
class RequestLogged(Message, bubble=False):
    """The embedded server (or a chat in the TUI) finished a request."""

    entry: RequestLogEntry


@dataclass
class DownloadUpdated(Message, bubble=False):
    """Progress of one pull; a newer update replaces an older one still in the queue."""

    state: DownloadState

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, DownloadUpdated) and message.state.key == self.state.key and self.state.active


@dataclass
class Notice(Message, bubble=False):
    """A finished action worth one line at the corner of the screen."""

    text: str
    title: str = ""
