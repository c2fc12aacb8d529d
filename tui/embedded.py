"""The embedded server: who holds the port, and uvicorn running in the TUI's event loop.

``localrun tui`` serves the same ModelManager it shows. Before starting, it asks who holds
the port: nobody (serve it), another localrun (attach to it as a client) or something
else (say so and offer a free port). uvicorn binds the socket itself: a socket handed in
pre-bound loses the TCP_NODELAY uvicorn sets, and every streamed token pays for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localrun.errors import RuntimeUnavailable

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from localrun.manager import ModelManager
    from localrun.settings import Settings

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class PortCheck:
    """Who holds ``host:port``: ``free``, ``localrun`` or ``other`` (with what was seen)."""

    host: str
    port: int
    state: str
    detail: str = ""

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"


def url_host(host: str) -> str:
    """The address a client dials for a bind address (0.0.0.0 → 127.0.0.1, IPv6 in brackets)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _bindable(host: str, port: int) -> OSError | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is free
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def check_port(host: str, port: int, *, api_key: str | None = None, timeout_s: float = 1.0) -> PortCheck:
    """Try the bind uvicorn would do; if the port is taken, ask the holder whether it is localrun."""
    error = _bindable(host, port)
    if error is None:
        return PortCheck(host, port, "free")
    if error.errno != errno.EADDRINUSE:
        return PortCheck(host, port, "other", f"cannot bind {host}:{port}: {error.strerror or error}")
    import httpx

    base = f"http://{url_host(host)}:{port}"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(f"{base}/health", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return PortCheck(
            host, port, "other", f"port {port} is in use by a program that does not answer HTTP ({type(exc).__name__})"
        )
    if _looks_like_localrun(resp):
        if resp.status_code == 401:
            return PortCheck(
                host,
                port,
                "other",
                f"localrun serves {base} but refuses this window's API key: set the same LOCALRUN_API_KEY to manage it",
            )
        return PortCheck(host, port, "localrun", f"localrun is already serving {base}")
    server = resp.headers.get("server", "an unknown program")
    return PortCheck(
        host, port, "other", f"port {port} is in use by {server} (GET /health answered {resp.status_code})"
    )


def _looks_like_localrun(resp: Any) -> bool:
    """localrun's /health: its own status keys, or (with a key required) its auth realm."""
    if 'realm="localrun"' in resp.headers.get("www-authenticate", ""):
        return True
    try:
        body = resp.json()
    except ValueError:
        return False
    return (
        isinstance(body, dict)
        and body.get("status") == "ok"
        and {"version", "worker_restarts", "models"} <= body.keys()
    )


def find_free_port(host: str, start: int, *, tries: int = 50) -> int | None:
    """The first bindable port after ``start``; None when ``tries`` ports are all taken."""
    for port in range(start + 1, min(start + 1 + tries, 65536)):
        if _bindable(host, port) is None:
            return port
    return None


class EmbeddedServer:
    """The FastAPI app from ``create_app`` served by uvicorn as a task of the running loop."""

    def __init__(
        self, settings: Settings, manager: ModelManager, *, host: str, port: int, middleware: Any = None
    ) -> None:
        self.settings = settings
        self.manager = manager
        self.host = host
        self.port = port
        self._middleware = middleware
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.exit_error: str | None = None

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and bool(self._server and self._server.started)

    def build_app(self) -> FastAPI:
        try:
            from localrun.server.app import create_app
        except ImportError as exc:
            raise RuntimeUnavailable(
                f"the localrun server is not available in this install ({exc})",
                hint="reinstall localrun; the TUI works without serving",
            ) from exc
        app = create_app(self.settings, self.manager)
        return self._middleware(app) if self._middleware else app

    async def start(self) -> str:
        """Serve; return the URL once listening. Raises RuntimeUnavailable when it cannot."""
        app = self.build_app()  # RuntimeUnavailable when the server is not part of this install
        from localrun.server.serve import check_bind_policy, uvicorn_server

        check_bind_policy(self.settings)  # no key, no listening beyond loopback
        # The same server as `localrun serve`, minus its signal handling: the TUI owns the terminal and its keys.
        self._server = uvicorn_server(app, self.host, self.port, handle_signals=False)
        self._task = asyncio.create_task(self._serve(), name="localrun-embedded-server")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if self._task.done() or loop.time() > deadline:
                await self.stop()
                raise RuntimeUnavailable(
                    f"the server could not start on {self.host}:{self.port}: "
                    f"{self.exit_error or 'it did not come up in time'}",
                    hint="pick another port (LOCALRUN_SERVER__PORT) or see the log",
                )
            await asyncio.sleep(0.02)
        log.info("embedded server listening on %s", self.url)
        return self.url

    async def _serve(self) -> None:
        server = self._server
        if server is None:  # the task is made only after the server (start)
            return
        try:
            await server.serve()
        except SystemExit as exc:  # uvicorn exits on bind and lifespan failures; the TUI must not
            self.exit_error = f"uvicorn stopped (exit {exc.code}); the port may be taken"
            log.error("embedded server stopped: %s", self.exit_error)

    async def stop(self, timeout_s: float = 5.0) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
