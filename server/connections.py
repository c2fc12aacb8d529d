"""Refused requests never hold a connection: :class:`RefusalGuard` and :class:`ConnectionBook`.

A request answered before its body was read — a 401 without the key, a 403 Host, a 413, a 415,
a CORS preflight, anything the guards refuse — used to leave the rest of its body unread on the
connection; h11 then keeps the connection (the keep-alive timer restarts at every byte), so a
client trickling one byte every two seconds, or a chunked body that never ends, held it for as
long as it liked, without a key. :class:`RefusalGuard` sits outside every other middleware and
looks at each response as it starts: when the request's body has not been read whole, it drains
it then, within ``server.refused_body_timeout_s`` and ``server.refused_body_max_bytes`` (both
also bounded by the body deadline and size limit), so a well-behaved client keeps its
connection; past either bound the refusal goes out with ``Connection: close`` and the server
hangs up. A request carrying both Content-Length and Transfer-Encoding is answered and the
connection closed (RFC 9112 §6.3: the framing is ambiguous, so nothing after it can be trusted).

:class:`ConnectionBook` bounds how many connections one address may hold before it has shown
the API key (``server.max_unauthenticated_connections``): the protocol (serve.py) registers each
connection and refuses one more past the cap with a 429 and a close; the RequestGuard marks a
connection, and its address, authenticated once a request carries the key. An address that has
shown the key is not capped (a client opening many connections at once before its first
request is answered is normal). Without an API key there is nothing to authenticate and no cap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

#: Where the app keeps its ConnectionBook (app.state), for the protocol and the RequestGuard.
BOOK_STATE = "connection_book"
#: Addresses remembered as having shown the key (least recently seen forgotten first).
_TRUSTED_MAX = 4096


class ConnectionBook:
    """Open connections by address, and which have shown the API key."""

    def __init__(self, cap: int, *, enforced: bool) -> None:
        self.cap = cap
        self.enforced = enforced
        self._unauthenticated: dict[str, set[int]] = {}
        self._trusted: OrderedDict[str, None] = OrderedDict()

    def admit(self, host: str, port: int) -> bool:
        """Register a new connection; False when its address already holds ``cap`` without the key."""
        if not self.enforced:
            return True
        if host in self._trusted:
            self._trusted.move_to_end(host)
            return True
        ports = self._unauthenticated.setdefault(host, set())
        if len(ports) >= self.cap:
            return False
        ports.add(port)
        return True

    def authenticated(self, host: str, port: int) -> None:
        """The connection (host, port) carried the key: it and its address are no longer capped."""
        if not self.enforced:
            return
        self._forget(host, port)
        self._trusted[host] = None
        self._trusted.move_to_end(host)
        while len(self._trusted) > _TRUSTED_MAX:
            self._trusted.popitem(last=False)

    def closed(self, host: str, port: int) -> None:
        self._forget(host, port)

    def held(self, host: str) -> int:
        """Connections from ``host`` that have not shown the key."""
        return len(self._unauthenticated.get(host, ()))

    def _forget(self, host: str, port: int) -> None:
        ports = self._unauthenticated.get(host)
        if ports is None:
            return
        ports.discard(port)
        if not ports:
            del self._unauthenticated[host]


def _headers(scope: Scope) -> dict[bytes, list[bytes]]:
    found: dict[bytes, list[bytes]] = {}
    for key, value in scope.get("headers", ()):
        found.setdefault(key, []).append(value)
    return found


class _BodyState:
    """How much of one request's body has been read, and whether all of it."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.read = 0
        self.done = False
        self.gone = False


class RefusalGuard:
    """Drain what a refused request still sends, within bounds, or close its connection."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        timeout_s: float,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        lengths = headers.get(b"content-length", [])
        chunked = b"transfer-encoding" in headers
        # Both framings at once (or two lengths): answer, then close (RFC 9112 §6.3, §6.2).
        ambiguous = (chunked and bool(lengths)) or len(lengths) > 1
        has_body = chunked or any(v.strip() not in (b"", b"0") for v in lengths)
        expects_continue = any(v.lower() == b"100-continue" for v in headers.get(b"expect", []))
        if not has_body and not ambiguous:
            await self.app(scope, receive, send)
            return
        declared = int(lengths[0]) if len(lengths) == 1 and lengths[0].strip().isdigit() else 0
        state = _BodyState(time.monotonic())

        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state.read += len(message.get("body", b""))
                if not message.get("more_body", False):
                    state.done = True
            else:
                state.gone = True
            return message

        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                close = ambiguous
                if not close and not state.done and not state.gone:
                    # Never drain a body the client is waiting to be asked for (100-continue),
                    # nor one that says it is larger than a refusal may read.
                    close = expects_continue or declared > self.max_bytes or not await self._drain(counted, state)
                if close:
                    kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
                    message = {**message, "headers": [*kept, (b"connection", b"close")]}
                    log.info(
                        "%s %s: answered %s and closed the connection (%s)",
                        scope["method"][:16],
                        scope.get("path", "")[:100],
                        message.get("status"),
                        "both Content-Length and Transfer-Encoding" if ambiguous else "its body was not read",
                    )
            await send(message)

        await self.app(scope, counted, guarded)

    async def _drain(self, receive: Receive, state: _BodyState) -> bool:
        """Read and drop the rest of the body; False when it is too big, too slow, or the client left."""
        left = self.timeout_s - (time.monotonic() - state.started)
        if left <= 0:
            return False
        try:
            async with asyncio.timeout(left):
                while not state.done:
                    if state.read > self.max_bytes:
                        return False
                    message = await receive()
                    if message["type"] != "http.request":
                        return False
        except TimeoutError:
            return False
        return state.read <= self.max_bytes
