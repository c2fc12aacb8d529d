"""The server screen's request log and tokens/s, read from the manager's request timings.

Nothing here measures a token. An ASGI middleware opens a record per HTTP request (time,
method, route, status); the manager tells :meth:`RequestMeter.observe` of each stream it
starts (``ModelManager.observe_requests``), in the request's own context, and the record
takes that stream's :class:`~localrun.activity.RequestTiming`: the model, the tokens, the time
to first token and the decode rate, as the activity log and the server's stats read them. The
record is finished when the response is sent.

Chats typed in the TUI itself have no HTTP request around them: their stream's timing makes a
record of its own, finished when the stream ends, and shown in the log as ``TUI chat``.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localrun.activity import RequestTiming

log = logging.getLogger(__name__)

#: Routes that are polled, not used: logging them would bury the requests that matter.
#: Where the server's Observe middleware leaves its per-request stats in the ASGI scope.
SERVER_STATS_KEY = "localrun.stats"
#: An ASGI app: ``await app(scope, receive, send)``.
Asgi = Callable[[dict[str, Any], Callable[..., Any], Callable[..., Any]], Awaitable[None]]
QUIET_ROUTES = frozenset({"/health", "/metrics", "/api/ps", "/api/version"})


@dataclass(frozen=True)
class RequestLogEntry:
    """One finished request, as the server screen's log shows it."""

    at: float  # wall clock when the request arrived
    method: str
    route: str
    model: str | None
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None
    tok_s: float | None
    status: int
    duration_s: float
    drafted_tokens: int = 0  # speculative decoding: tokens drafted and verified
    accepted_tokens: int = 0  # … and kept


@dataclass
class _Pending:
    """A request in flight: the middleware's record, or a TUI chat's; its numbers come from its timing."""

    method: str
    route: str
    at: float
    started: float
    model: str | None = None
    timing: RequestTiming | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token: float | None = None
    last_token: float | None = None
    status: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    def take_timing(self) -> None:
        """Copy what the request's timing measured (nothing when no stream was started)."""
        t = self.timing
        if t is None:
            return
        self.model = self.model or t.model
        self.prompt_tokens, self.completion_tokens = t.prompt_tokens, t.completion_tokens
        self.first_token, self.last_token = t.first_token_at, t.last_token_at
        if t.usage is not None:
            self.drafted_tokens, self.accepted_tokens = t.usage.drafted_tokens, t.usage.accepted_tokens

    def entry(self) -> RequestLogEntry:
        out = self.completion_tokens
        ttft = self.first_token - self.started if self.first_token is not None else None
        rate = None
        if out > 1 and self.first_token is not None and self.last_token and self.last_token > self.first_token:
            rate = (out - 1) / (self.last_token - self.first_token)
        return RequestLogEntry(
            at=self.at,
            method=self.method,
            route=self.route,
            model=self.model,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=out,
            ttft_s=ttft,
            tok_s=rate,
            status=self.status,
            duration_s=time.perf_counter() - self.started,
            drafted_tokens=self.drafted_tokens,
            accepted_tokens=self.accepted_tokens,
        )


def _printable(text: str, limit: int = 80) -> str:
    """A client-chosen path, safe to show: no control characters, bounded."""
    return "".join(ch for ch in text if ch.isprintable())[:limit]


def _merge_server_stats(pending: _Pending, scope: dict[str, Any]) -> None:
    """Prefer what the server's own metrics learned (exact token counts, its route template)."""
    route = getattr(scope.get("route"), "path", None)
    if route:
        pending.route = route
    stats = scope.get(SERVER_STATS_KEY)
    if stats is None or not getattr(stats, "model", None):
        return
    pending.model = stats.model
    pending.prompt_tokens = stats.prompt_tokens or pending.prompt_tokens
    pending.completion_tokens = stats.completion_tokens or pending.completion_tokens
    pending.drafted_tokens = getattr(stats, "drafted_tokens", 0) or pending.drafted_tokens
    pending.accepted_tokens = getattr(stats, "accepted_tokens", 0) or pending.accepted_tokens
    if stats.first_token_at is not None:
        pending.first_token, pending.last_token = stats.first_token_at, stats.last_token_at
        pending.started = stats.start


_current: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar("localrun_tui_request", default=None)


class RequestMeter:
    """Collects finished requests and a running token count (for the tokens/s sparkline)."""

    def __init__(self, on_entry: Callable[[RequestLogEntry], None]) -> None:
        self._on_entry = on_entry
        self._lock = threading.Lock()
        self._ended_tokens = 0
        self._live: set[RequestTiming] = set()

    @property
    def tokens_total(self) -> int:
        """Tokens streamed since start (ended streams and those still running): the sparkline
        samples its differences."""
        with self._lock:
            return self._ended_tokens + sum(t.tokens for t in self._live)

    def observe(self, timing: RequestTiming) -> None:
        """The manager's request listener (``ModelManager.observe_requests``): called as a stream
        starts, in its caller's context, so an HTTP request's record is found here."""
        pending = _current.get()
        own = pending is None
        if pending is None:  # a chat typed in the TUI: no HTTP request around it
            pending = _Pending("TUI", "chat", time.time(), time.perf_counter(), model=timing.model, status=200)
        else:
            pending.model = timing.model
        pending.timing = timing
        with self._lock:
            self._live.add(timing)
        timing.on_end(lambda t: self._ended(t, pending if own else None))

    def _ended(self, timing: RequestTiming, own: _Pending | None) -> None:
        with self._lock:
            self._live.discard(timing)
            self._ended_tokens += timing.tokens
        if own is not None:
            if timing.failed:
                own.status = 499 if timing.cancelled else 500
            own.take_timing()
            self._finish(own)

    def _finish(self, pending: _Pending) -> None:
        try:
            self._on_entry(pending.entry())
        except Exception:  # noqa: BLE001 - a display hook must never fail a request
            log.exception("request log listener failed")

    def middleware(self, app: Asgi) -> Asgi:
        """Wrap an ASGI app so each HTTP request becomes a log entry."""

        async def metered(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
            if scope.get("type") != "http" or scope.get("path") in QUIET_ROUTES:
                await app(scope, receive, send)
                return
            pending = _Pending(
                scope.get("method", "?"), _printable(scope.get("path", "?")), time.time(), time.perf_counter()
            )
            token = _current.set(pending)

            async def send_and_note(message: dict[str, Any]) -> None:
                if message.get("type") == "http.response.start":
                    pending.status = int(message.get("status", 0))
                await send(message)

            try:
                await app(scope, receive, send_and_note)
            except Exception:  # noted as the 500 the error handler outside answers, then re-raised to it
                pending.status = pending.status or 500
                raise
            finally:
                _current.reset(token)
                pending.take_timing()
                _merge_server_stats(pending, scope)
                self._finish(pending)

        return metered
