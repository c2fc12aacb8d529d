"""Security middleware: the Host allowlist, the API key, JSON-only bodies, a size limit.

Two plain ASGI middlewares (no per-request task or thread): :class:`HostGuard` runs
first of all, then CORS, then :class:`RequestGuard`. Together they close
the holes local model servers keep shipping: DNS rebinding (a web page whose name now
points at 127.0.0.1 — its requests carry that page's Host), browser ``text/plain`` POSTs
that skip the CORS preflight, servers bound to the network without a key, and unbounded
bodies. The request body is read here, bounded in size and time, and replayed to the app, so
no route ever sees more than ``max_body_bytes`` and no client holds a request open by
trickling (or never ending) its body.

The JSON-only rule is a defence against browsers, so it applies to requests a browser could
have sent: those with an ``Origin`` or a ``Sec-Fetch-*`` header (every browser sends one on a
cross-origin POST). A request with neither — curl's ``-d``, which says
``application/x-www-form-urlencoded``, Ollama's documented examples, litellm, which sends no
Content-Type — is read as JSON whatever it says; the Host allowlist still stands against rebinding.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localrun.errors import LocalrunError
from localrun.server.connections import ConnectionBook
from localrun.server.errors import BodyTooLarge, HostNotAllowed, NotJson, Unauthorized, scope_error_response
from localrun.server.metrics import STATS_KEY, access_log

log = logging.getLogger(__name__)

#: Origins a browser page on this machine, a desktop app shell or a browser extension sends:
#: Ollama's default OLLAMA_ORIGINS (with its AllowBrowserExtensions), less 0.0.0.0, which no
#: Host allowlist here accepts either, and never ``null``, the origin of sandboxed frames and of
#: any downloaded file opened in a browser. A web page elsewhere has its own origin (a rebinding
#: page's is its public name), so it stays refused.
LOCAL_ORIGINS = (
    r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?"
    r"|(app|tauri|vscode-webview|vscode-file|file)://[^\s]*"
    r"|(chrome-extension|moz-extension|safari-web-extension)://[^\s]*"
)
#: What browser clients send beyond the simple headers: Ollama's list (OpenAI's JS SDK
#: headers included) and Anthropic's key and version headers.
CORS_HEADERS = (
    "Authorization",
    "Content-Type",
    "User-Agent",
    "Accept",
    "X-Requested-With",
    "OpenAI-Beta",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    *(
        f"x-stainless-{name}"
        for name in (
            "arch",
            "async",
            "custom-poll-interval",
            "helper-method",
            "lang",
            "os",
            "package-version",
            "poll-helper",
            "retry-count",
            "runtime",
            "runtime-version",
            "timeout",
        )
    ),
)


class BodyTimeout(LocalrunError):
    """The request body did not arrive whole within ``server.body_timeout_s``."""

    http_status = 408
    code = "request_timeout"


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
#: Ollama's blob uploads (``POST /api/blobs/sha256:…``): streamed to the route, not buffered.
BLOB_UPLOAD_PREFIX = "/api/blobs/"
_PORT = re.compile(r"[0-9]{1,5}")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_DUPLICATE = "\x00duplicate"  # a header sent twice: never a valid value


class _Gone:
    """What the body reader returns when the client left before sending the whole body."""


_GONE = _Gone()


def trusted_origins(listed: list[str] | tuple[str, ...], *, local: bool) -> Callable[[str], bool]:
    """Whether an ``Origin`` is one CORS lets read answers: listed exactly, or (``local``) a page
    on this machine, an app shell or a browser extension (:data:`LOCAL_ORIGINS`)."""
    exact = frozenset(o.rstrip("/").lower() for o in listed)
    pattern = re.compile(LOCAL_ORIGINS) if local else None

    def trusted(origin: str) -> bool:
        o = origin.rstrip("/").lower()
        return "*" in exact or o in exact or (pattern is not None and pattern.fullmatch(o) is not None)

    return trusted


def is_loopback_host(host: str) -> bool:
    """True when binding ``host`` exposes the server to this machine only."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    # The short IPv4 forms the resolver (and so the bind) accepts: 127.1, 127.0.1 (inet_aton's rules).
    if re.fullmatch(r"[0-9]+(\.[0-9]+){1,2}", h):
        try:
            return ipaddress.ip_address(socket.inet_aton(h)).is_loopback
        except OSError:
            return False
    return False


def allowed_host_names(bind_host: str, extra: list[str] | tuple[str, ...] = ()) -> frozenset[str]:
    """The exact Host names accepted: loopback names, the configured ones, and the bind address.

    The bind address is safe to add when it is a concrete IP: a rebinding page's requests
    carry the page's own name, never a bare IP literal.
    """
    names = {n.lower() for n in LOOPBACK_NAMES}
    for name in extra:
        name = name.strip().lower()
        if name:
            names.add(name)
    h = bind_host.strip().strip("[]")
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        ip = None
    if ip is not None and not ip.is_unspecified:
        names.add(f"[{ip}]" if ip.version == 6 else str(ip))
    return frozenset(names)


def host_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Exact match of the Host header (name, or name:port with a numeric port)."""
    if not header:
        return False
    value = header.lower()
    if value in allowed:
        return True
    name, sep, port = value.rpartition(":")
    if not sep or not name or not _PORT.fullmatch(port) or int(port) > 65535:
        return False
    if name in allowed:
        return True
    return False


def _header(scope: Scope, key: bytes) -> str | None:
    found = None
    for k, v in scope.get("headers", ()):
        if k == key:
            if found is not None:  # two Host headers (or two keys): ambiguous, refuse
                return _DUPLICATE
            found = v.decode("latin-1")
    return found


class HostGuard:
    """Refuse any request whose Host is not exactly on the allowlist (403), before anything else."""

    def __init__(self, app: ASGIApp, *, allowed: frozenset[str]):
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host")
        if not host_allowed(host, self.allowed):
            log.warning("refused Host header %r on %s", (host or "")[:100], scope.get("path", "")[:100])
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            exc = HostNotAllowed(
                f"Host {(host or '')[:100]!r} is not allowed",
                hint="use localhost or 127.0.0.1, or add the name to server.allowed_hosts",
            )
            await scope_error_response(exc, scope)(scope, receive, send)
            return
        await self.app(scope, receive, send)


#: The one route answered without the key (liveness only), and the scope flag that says so.
LIVENESS_PATH = "/health"
AUTHENTICATED_KEY = "localrun.authenticated"


class RequestGuard:
    """API key, JSON content type and a bounded body, in that order."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        max_body_bytes: int,
        body_timeout_s: float = 60.0,
        trusted_origin: Callable[[str], bool] = lambda origin: False,
        open_paths: Callable[[str], bool] | None = None,
        book: ConnectionBook | None = None,
    ):
        self.app = app
        self.book = book
        self.api_key = api_key.encode() if api_key else None
        #: Paths a GET or HEAD reaches without the key: the web page's static files (server/web).
        self.open_paths = open_paths
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        #: Origins CORS already lets read answers (the local ones, ``server.cors_origins``): a
        #: ``text/plain`` body from one of them is no CSRF risk, so it is read as JSON, as Ollama does.
        self.trusted_origin = trusted_origin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":  # no websocket routes; refuse without reading
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        problem: LocalrunError | None = self._check_key(scope)
        client = scope.get("client")
        if problem is None and self.api_key is not None and self.book is not None and client:
            self.book.authenticated(client[0], client[1])
        if problem is not None and path == LIVENESS_PATH and scope["method"] in ("GET", "HEAD"):
            # Probes carry no key: they get liveness only (the route reads this flag), never a 401.
            scope[AUTHENTICATED_KEY] = False
            problem = None
        elif problem is not None and self.open_paths and scope["method"] in ("GET", "HEAD") and self.open_paths(path):
            problem = None  # the page and its files hold nothing secret; the page asks for the key itself
        problem = problem or self._check_body_headers(scope)
        if problem is not None:
            await scope_error_response(problem, scope)(scope, receive, send)
            return
        if scope["method"] == "POST" and path.startswith(BLOB_UPLOAD_PREFIX):
            # An upload of any size streams to its route (which bounds its pace and size and
            # verifies its digest), never held here in memory.
            await self.app(scope, receive, send)
            return
        if (
            scope["method"] in _BODY_METHODS
            or _header(scope, b"content-length")
            or _header(scope, b"transfer-encoding")
        ):
            try:
                async with asyncio.timeout(self.body_timeout_s):
                    body = await self._read_body(receive)
            except TimeoutError:
                log.info(
                    "%s %s: the body did not arrive in %.0f s", scope["method"][:32], path[:100], self.body_timeout_s
                )
                exc = BodyTimeout(
                    f"the request body did not arrive within {self.body_timeout_s:g} s",
                    hint="send the whole body at once, or raise server.body_timeout_s",
                )
                response = scope_error_response(exc, scope)
                response.headers["connection"] = "close"  # the rest of the body is never read
                await response(scope, receive, send)
                return
            if isinstance(body, _Gone):
                return  # the client left before sending the whole body: nothing to answer
            if body is None:
                too_large = BodyTooLarge(
                    f"the request body is larger than {self.max_body_bytes} bytes",
                    hint="send a smaller request or raise server.max_body_bytes",
                )
                await scope_error_response(too_large, scope)(scope, receive, send)
                return
            receive = _replay(body, receive)
            if access_log.isEnabledFor(logging.DEBUG):
                _note_requested_model(scope, body)
        await self.app(scope, receive, send)

    def _check_key(self, scope: Scope) -> Unauthorized | None:
        if self.api_key is None:
            return None
        auth = _header(scope, b"authorization") or ""
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("latin-1"), self.api_key):
            return None
        # Anthropic's clients send the key as x-api-key (Claude Code with ANTHROPIC_API_KEY).
        other = _header(scope, b"x-api-key")
        if other is not None and hmac.compare_digest(other.strip().encode("latin-1"), self.api_key):
            return None
        auth = auth or (other or "")
        why = "no API key was sent" if not auth else "the API key is not valid"
        return Unauthorized(
            f"{why}",
            hint="send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>') with the server's API key",
        )

    def _check_body_headers(self, scope: Scope) -> LocalrunError | None:
        method = scope["method"]
        length = _header(scope, b"content-length")
        if method == "POST" and scope.get("path", "").startswith(BLOB_UPLOAD_PREFIX):
            length = None  # an upload's size is its route's to bound (it streams, never held here)
        if length is not None:
            if not length.isdigit():
                return BodyTooLarge("invalid Content-Length header")
            if int(length) > self.max_body_bytes:
                return BodyTooLarge(
                    f"the request body ({length} bytes) is larger than {self.max_body_bytes} bytes",
                    hint="send a smaller request or raise server.max_body_bytes",
                )
        has_body = (length is not None and length != "0") or _header(scope, b"transfer-encoding") is not None
        if not _from_browser(scope):
            return None  # no browser sent this: its body is read as JSON whatever it is labelled
        if self._trusted_page(scope):
            return None  # a page CORS already trusts (fetch() without a Content-Type sends text/plain)
        if method in _BODY_METHODS or (method == "DELETE" and has_body):
            ctype = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                return NotJson(
                    f"request bodies must be application/json, not {ctype or 'missing'!r}",
                    hint="send the body as JSON with 'Content-Type: application/json'",
                )
        return None

    def _trusted_page(self, scope: Scope) -> bool:
        """The request comes from a page of a trusted origin, or of this server itself."""
        origin = _header(scope, b"origin")
        if origin is None or origin == _DUPLICATE:
            return _header(scope, b"sec-fetch-site") == "same-origin"
        if origin.lower() == "null":
            return False
        host = _header(scope, b"host")
        scheme, _, rest = origin.partition("://")
        if host and host != _DUPLICATE and scheme in ("http", "https") and rest.lower() == host.lower():
            return True  # same origin: the page was served by this server
        return self.trusted_origin(origin)

    async def _read_body(self, receive: Receive) -> bytes | _Gone | None:
        """The whole body; None when it outgrows the limit; _GONE when the client left."""
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return _GONE
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


def _from_browser(scope: Scope) -> bool:
    """True when the request carries what a browser adds and a page cannot remove: ``Origin``
    (on every cross-origin POST) or a ``Sec-Fetch-*`` header (forbidden to scripts)."""
    for key, _ in scope.get("headers", ()):
        if key == b"origin" or key.startswith(b"sec-fetch-"):
            return True
    return False


def _note_requested_model(scope: Scope, body: bytes) -> None:
    """For the DEBUG access line: the model the body names, if any (the body itself is never logged)."""
    stats = scope.get(STATS_KEY)
    if stats is None or not body.lstrip().startswith(b"{"):
        return
    try:
        model = json.loads(body).get("model")
    except (ValueError, RecursionError):
        return  # not JSON: the route will say so
    if isinstance(model, str):
        stats.requested_model = model


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the already-read body once, then the real channel (disconnects)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
