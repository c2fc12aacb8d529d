"""``run_server``: serve the app with uvicorn, refusing unsafe or impossible setups clearly.

uvicorn binds the socket itself: a socket bound here and handed over would lose
TCP_NODELAY (uvicorn#3149), adding ≈ 40 ms to every keep-alive request after the first.
A port in use is a ConfigError naming it — never a silent move to another port or
interface — and a non-loopback host without an API key does not start at all.

No client holds a connection forever: uvicorn's h11 protocol has a keep-alive timeout but no
deadline for the request head (a client that connects and sends nothing, or one header byte a
second, is kept until it leaves), so :func:`deadline_protocol` adds one; the body's deadline is
the RequestGuard's (security.py), and ``timeout_keep_alive`` covers the idle time between requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import socket
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from localrun.errors import ConfigError
from localrun.server.connections import BOOK_STATE, ConnectionBook
from localrun.server.security import is_loopback_host
from localrun.settings import Settings

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

    from localrun.manager import ModelManager

log = logging.getLogger(__name__)


def check_bind_policy(settings: Settings) -> None:
    """Refuse to expose the server beyond this machine without an API key."""
    host = settings.server.host
    if not is_loopback_host(host) and not settings.server.api_key:
        raise ConfigError(
            f"refusing to listen on {host}: it is reachable from other machines and no API key is set",
            hint="set an API key (--api-key or LOCALRUN_API_KEY) or bind 127.0.0.1",
        )


def server_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def _port_in_use_error(host: str, port: int, exc: OSError | None = None) -> ConfigError:
    why = f": {exc.strerror}" if exc is not None and exc.strerror else ""
    return ConfigError(
        f"port {port} on {host} is already in use{why}",
        hint=f"stop what listens on port {port}, or choose another with --port (or server.port)",
    )


def probe_port(host: str, port: int) -> None:
    """Fail early, with the port's name in the message, when it cannot be bound.

    The probe socket is closed at once; uvicorn then binds its own.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(
            host, port, family if host not in ("", "localhost") else socket.AF_UNSPEC, socket.SOCK_STREAM
        )
    except socket.gaierror as exc:
        raise ConfigError(f"cannot resolve host {host!r}: {exc}", hint="use an IP address such as 127.0.0.1") from exc
    fam, kind, proto, _, addr = infos[0]
    probe = socket.socket(fam, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        probe.bind(addr)
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise _port_in_use_error(host, port, exc) from exc
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}", hint="check server.host and server.port") from exc
    finally:
        probe.close()


_HEAD_TIMEOUT_TEXT = b"the request head took too long\n"
#: Sent, then the connection closed, to a client whose request head missed its deadline.
_HEAD_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_HEAD_TIMEOUT_TEXT), _HEAD_TIMEOUT_TEXT)
)


_CAPPED_TEXT = b"too many connections from this address without the API key\n"
#: Sent, then the connection closed, to one more connection from an address already holding
#: ``server.max_unauthenticated_connections`` without having shown the key.
_CAPPED_RESPONSE = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_CAPPED_TEXT), _CAPPED_TEXT)
)


def deadline_protocol(header_timeout_s: float, book: ConnectionBook | None = None) -> type:
    """uvicorn's h11 protocol with a deadline for each request head (request line and headers).

    The clock starts when the connection opens, and for a later request on a kept-alive
    connection when its first byte arrives; it stops once h11 has the whole head. A client
    still sending its head at the deadline gets a 408 and the connection closed. (h11 alone
    bounds the head's size, h11_max_incomplete_event_size, but not its time.) Always h11, even
    where httptools is installed, so the same deadline holds on every machine.

    With a ``book`` (server/connections.py), each connection is registered by address, and one
    more from an address already holding its cap of connections without the key gets a 429 and
    is closed at once.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadDeadlineProtocol(H11Protocol):
        _head_timer: Any = None

        # uvicorn's own connection_made narrows asyncio's transport type the same way (it carries this ignore).
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if book is not None and self.client is not None:
                if not book.admit(*self.client):
                    log.info("refused a connection from %s: %d held without the API key", self.client[0], book.cap)
                    transport.write(_CAPPED_RESPONSE)
                    transport.close()
                    return
            self._arm_head_deadline()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self.conn.their_state is h11.IDLE:
                self._arm_head_deadline()  # the first byte of a later request on this connection
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._cancel_head_deadline()  # the head is complete (or the connection failed)

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_deadline()
            if book is not None and self.client is not None:
                book.closed(*self.client)
            super().connection_lost(exc)

        def _arm_head_deadline(self) -> None:
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_deadline_passed)

        def _cancel_head_deadline(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_deadline_passed(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                log.info(
                    "closed a connection from %s: no complete request head in %.0f s", self.client, header_timeout_s
                )
                self.transport.write(_HEAD_TIMEOUT_RESPONSE)
                self.transport.close()

    return HeadDeadlineProtocol


def uvicorn_server(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    ready_callback: Callable[[str], None] | None = None,
    handle_signals: bool = True,
) -> uvicorn.Server:
    """A uvicorn.Server for ``app`` with localrun's options (our logging and access log, no
    proxy headers, no server header, no websockets, the read deadlines of ``server.*``).
    ``server.run()`` blocks (the CLI); ``await server.serve()`` runs it in an existing event
    loop (the TUI), where ``handle_signals=False`` leaves Ctrl-C and the terminal to the host application."""
    import uvicorn

    from localrun.settings import ServerSettings

    settings = getattr(getattr(app, "state", None), "settings", None)
    limits: ServerSettings = settings.server if settings is not None else ServerSettings()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=deadline_protocol(limits.header_timeout_s, getattr(getattr(app, "state", None), BOOK_STATE, None)),
        # uvicorn types it int, but it is only a loop.call_later delay, where a float serves.
        timeout_keep_alive=limits.keep_alive_timeout_s,  # type: ignore[arg-type]
        log_config=None,  # keep the process's logging; the access log is ours
        access_log=False,
        proxy_headers=False,  # never trust X-Forwarded-For: nothing sits in front of us
        server_header=False,
        timeout_graceful_shutdown=3,
        ws="none",
        lifespan="on",
    )

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and ready_callback is not None:
                ready_callback(server_url(host, self.bound_port()))

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            if not handle_signals:
                yield
                return
            with super().capture_signals():
                yield

        def bound_port(self) -> int:
            for server in getattr(self, "servers", ()):
                for sock in server.sockets:
                    bound: int = sock.getsockname()[1]
                    return bound
            return port

    return _Server(config)


def build_server(
    settings: Settings,
    manager: ModelManager,
    *,
    ready_callback: Callable[[str], None] | None = None,
    handle_signals: bool = True,
) -> uvicorn.Server:
    """The server for ``create_app(settings, manager)`` (see :func:`uvicorn_server`), after
    the host and port checks. Raises ConfigError for a non-loopback host without a key or a
    port already in use."""
    from localrun.server.app import create_app

    check_bind_policy(settings)
    probe_port(settings.server.host, settings.server.port)
    return uvicorn_server(
        create_app(settings, manager),
        settings.server.host,
        settings.server.port,
        ready_callback=ready_callback,
        handle_signals=handle_signals,
    )


def run_server(
    settings: Settings, manager: ModelManager, *, ready_callback: Callable[[str], None] | None = None
) -> None:
    """Serve until interrupted. Raises ConfigError for an unsafe host or a port in use."""

    def ready(url: str) -> None:
        # A full collection walks every object the process holds: hundreds of milliseconds with
        # the GIL held (the loop stood still 0.27 s when a first image request's imports set one
        # off). This process is the server's and its startup heap lives as long as it does: freeze
        # it, so later collections walk only what requests made. (Not for a server embedded in
        # another program, the TUI's or a test's: their heaps are theirs.)
        gc.collect()
        gc.freeze()
        if ready_callback is not None:
            ready_callback(url)

    server = build_server(settings, manager, ready_callback=ready)
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits when its bind fails (a race after our probe)
        host, port = settings.server.host, settings.server.port
        raise ConfigError(
            f"could not listen on {host}:{port}; the port is probably in use",
            hint=f"stop what listens on port {port}, or choose another with --port",
        ) from exc
