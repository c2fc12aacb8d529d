"""The server screen's request log and tokens/s, measured where requests pass.

Two taps share one context variable. An ASGI middleware opens a record per HTTP request
(time, method, route, status); a thin proxy around the ModelManager fills in the model,
the tokens, the time to first token and the decode rate as chunks flow through it. The
record is finished when the response is sent. The proxy forwards everything else to the
same manager, so the server and the TUI still share one set of loaded models.

Chats typed in the TUI itself go through the same proxy and appear in the log as
``TUI chat``.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from localrun.types import Chunk

log = logging.getLogger(__name__)

#: Routes that are polled, not used: logging them would bury the requests that matter.
#: Where the server's Observe middleware leaves its per-request stats in the ASGI scope.
SERVER_STATS_KEY = "localrun.stats"
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
    """A request in flight; mutated by the middleware and the manager proxy."""

    method: str
    route: str
    at: float
    started: float
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunks: int = 0
    first_token: float | None = None
    last_token: float | None = None
    status: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    def observe(self, chunk: Chunk) -> None:
        if chunk.text:
            now = time.perf_counter()
            if self.first_token is None:
                self.first_token = now
            self.last_token = now
            self.chunks += 1
        if chunk.usage is not None:
            self.prompt_tokens = chunk.usage.prompt_tokens
            self.completion_tokens = chunk.usage.completion_tokens
            self.drafted_tokens = chunk.usage.drafted_tokens
            self.accepted_tokens = chunk.usage.accepted_tokens

    def entry(self) -> RequestLogEntry:
        out = self.completion_tokens or self.chunks
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


def _merge_server_stats(pending: _Pending, scope: dict) -> None:
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
        self._tokens = 0

    @property
    def tokens_total(self) -> int:
        """Text chunks streamed since start: the sparkline samples its differences."""
        return self._tokens

    def _count(self, chunk: Chunk) -> None:
        if chunk.text:
            with self._lock:
                self._tokens += 1

    def _finish(self, pending: _Pending) -> None:
        try:
            self._on_entry(pending.entry())
        except Exception:  # noqa: BLE001 - a display hook must never fail a request
            log.exception("request log listener failed")

    def middleware(self, app: Callable) -> Callable:
        """Wrap an ASGI app so each HTTP request becomes a log entry."""

        async def metered(scope: dict, receive: Callable, send: Callable) -> None:
            if scope.get("type") != "http" or scope.get("path") in QUIET_ROUTES:
                await app(scope, receive, send)
                return
            pending = _Pending(
                scope.get("method", "?"), _printable(scope.get("path", "?")), time.time(), time.perf_counter()
            )
            token = _current.set(pending)

            async def send_and_note(message: dict) -> None:
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
                _merge_server_stats(pending, scope)
                self._finish(pending)

        return metered

    def wrap(self, manager: Any) -> MeteredManager:
        return MeteredManager(manager, self)


class MeteredManager:
    """The same ModelManager, with its streams observed. Everything else passes through."""

    def __init__(self, manager: Any, meter: RequestMeter) -> None:
        self._manager = manager
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)

    def _pending_for(self, name: str) -> tuple[_Pending, bool]:
        """The HTTP request's record, or a new one (owned by us) for a chat typed in the TUI."""
        pending = _current.get()
        if pending is None:
            return _Pending("TUI", "chat", time.time(), time.perf_counter(), model=name, status=200), True
        pending.model = name
        return pending, False

    def stream(self, name: str, req, cancel=None, **kw) -> Iterator[Chunk]:
        pending, own = self._pending_for(name)
        try:
            for chunk in self._manager.stream(name, req, cancel, **kw):
                pending.observe(chunk)
                self._meter._count(chunk)
                yield chunk
        except BaseException:
            if own:
                pending.status = 499 if cancel is not None and cancel.is_set() else 500
            raise
        finally:
            if own:
                self._meter._finish(pending)

    async def aopen(self, name: str, req, **kw) -> _MeteredOpenStream:
        pending, _ = self._pending_for(name)
        opened = await self._manager.aopen(name, req, **kw)
        return _MeteredOpenStream(opened, pending, self._meter)


class _MeteredOpenStream:
    """An ``OpenStream`` whose chunks are observed on their way out."""

    def __init__(self, opened: Any, pending: _Pending, meter: RequestMeter) -> None:
        self._opened = opened
        self._pending = pending
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._opened, name)

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        async for chunk in self._opened:
            self._pending.observe(chunk)
            self._meter._count(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._opened.aclose()
