"""The mirror's error answers: the hub's shape, and never a path of the mirror host in them.

A client of the mirror is another machine. What the store's files are called on this disk
(``/home/alice/.cache/huggingface/hub/models--…/blobs/<sha>``, an imported file's folder)
tells it the user's name and layout and helps it with nothing, so every message is scrubbed
before it goes out: an absolute path of this host becomes its last part (the file name a
person needs to act on). The full path still goes to the server's own log.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from localrun.errors import LocalrunError
from localrun.server.answers import OllamaError
from localrun.server.errors import ErrorShape, PlainMessage, message_of
from localrun.server.mirror.answers import HubError

#: An absolute POSIX path not inside a URL or a longer word, or a Windows drive path.
_POSIX_PATH = re.compile(r"(?<![\w.~:/%-])/[^\s'\"<>()\[\],;|]+")
_DRIVE_PATH = re.compile(r"(?<![\w])[A-Za-z]:[\\/][^\s'\"<>()\[\],;|]*")


def _short(path: str) -> str:
    tail = re.split(r"[\\/]+", path.rstrip("\\/"))[-1]
    return f".../{tail}" if tail else "..."  # ASCII: it also goes into a header


def _host_path(match: re.Match[str]) -> str:
    """A path whose first folder exists here is this host's (``/api/…`` or a repo path is not)."""
    path = match[0]
    first = path.lstrip("/").split("/", 1)[0]
    return _short(path) if first and os.path.isdir("/" + first) else path


def redact_paths(message: str) -> str:
    """``message`` with every absolute path of this host cut to its last part."""
    return _DRIVE_PATH.sub(lambda m: _short(m[0]), _POSIX_PATH.sub(_host_path, message))


def hub_error(status: int, message: str, *, code: str | None = None, commit: str | None = None) -> Response:
    """The hub's error shape: ``{"error": …}`` plus the headers huggingface_hub maps to types."""
    message = redact_paths(message)
    # h11 refuses a header value with white space at either end (and drops the connection), so
    # the cut at 400 characters must not leave a trailing space.
    safe = message.encode("ascii", "replace").decode().replace("\r", " ").replace("\n", " ")[:400].strip()
    headers = {"X-Error-Message": safe}
    if code:
        headers["X-Error-Code"] = code
    if commit:
        headers["X-Repo-Commit"] = commit
    return JSONResponse({"error": message}, status_code=status, headers=headers)


@dataclass(frozen=True)
class HubShape(ErrorShape):
    """The mirror's own routes: :func:`hub_error` for a LocalrunError (the status server/errors.py keeps)."""

    model: type[BaseModel] = HubError

    def body(self, exc: LocalrunError) -> dict[str, Any]:
        return {"error": redact_paths(message_of(exc))}

    def response(self, exc: LocalrunError, status: int) -> Response:
        return hub_error(status, message_of(exc))


HUB = HubShape()
#: What the guards answer before a mirror route runs: the listing routes' plain message, and on
#: a file route OpenAI's object (the document names both: :class:`HubError`).
LISTING = PlainMessage(model=OllamaError)
RESOLVING = ErrorShape(model=HubError)


def owns_listing(path: str) -> bool:
    return path == "/api/models" or path.startswith("/api/models/")


def owns_file(path: str) -> bool:
    return "/resolve/" in path
