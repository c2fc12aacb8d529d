"""The web app's files: read once from the package, served with their type, an ETag and a strict CSP.

The table is built when the app is (never at import), from ``static/`` next to this module through
:mod:`importlib.resources`, so it works from a wheel or a source tree alike. Only the names in the table
are ever served: a request names a file, never a path, so nothing outside ``static/`` can be reached.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from importlib import resources

log = logging.getLogger(__name__)

#: Where the files are served (the page itself is ``/``).
WEB_PREFIX = "/web/"

#: The page runs only its own scripts and styles (no inline script or style, no eval), talks only to
#: its origin, and cannot be framed. Images may be ``data:``/``blob:`` URLs: the previews of the
#: pictures a user attaches, which never leave the page but as base64 in a chat request.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
}

#: Headers every file of the app carries. ``no-cache`` with an ETag: the browser keeps its copy and
#: asks each time (a 304 when unchanged), so an upgraded localrun never runs an old script. No
#: Cross-Origin-Opener-Policy: browsers ignore it on plain HTTP beyond localhost (an intranet
#: address) and say so as a console error; ``frame-ancestors 'none'`` and no opener do its work.
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    """One file of the app, in memory."""

    name: str
    body: bytes
    content_type: str
    etag: str


def is_web_asset(path: str) -> bool:
    """Whether ``path`` is one the key guard lets through without a key (on GET and HEAD): the
    page and its files, which hold nothing secret. Every API call the page makes still needs the key."""
    return path == "/" or (path.startswith(WEB_PREFIX) and "/" not in path[len(WEB_PREFIX) :])


def load_assets() -> dict[str, Asset]:
    """Every file of ``static/`` by name (flat: the app has no sub-folders)."""
    folder = resources.files("localrun.server.web") / "static"
    table: dict[str, Asset] = {}
    for entry in folder.iterdir():
        name = entry.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        if not entry.is_file() or suffix not in CONTENT_TYPES:
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        table[name] = Asset(name, body, CONTENT_TYPES[suffix], etag)
    if "index.html" not in table:
        log.warning("the web app's files are missing from this install (no index.html in %s)", folder)
    return table
