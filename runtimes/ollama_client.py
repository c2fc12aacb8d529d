"""The Ollama server as localrun reaches it: where it is (``OLLAMA_HOST``, read the way Ollama's own CLI
reads it), the few routes localrun uses, and their errors mapped to the localrun tree. The runtime
(:mod:`.ollama`) holds one client per model it loads and one for probing and pulling."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from localrun.errors import (
    ContextOverflow,
    LocalrunError,
    ModelNotFound,
    RuntimeUnavailable,
    UnsupportedFeature,
    WorkerCrashed,
)
from localrun.runtimes.openai_compat.client import error_message
from localrun.runtimes.openai_compat.kinds import CONTEXT_WORDS
from localrun.runtimes.openai_compat.watch import abort_on_cancel
from localrun.types import Cancel

log = logging.getLogger(__name__)

DEFAULT_PORT = 11434
START_HINT = "start `ollama serve` or set OLLAMA_HOST"
PROBE_TIMEOUT_S = 1.0


def ollama_base_url(host: str | None = None) -> str:
    """``OLLAMA_HOST`` as Ollama's clients read it: ``host``, ``host:port``, ``:port`` or a URL.

    A missing scheme means http, a missing port 11434 (80/443 when the scheme is given),
    and 0.0.0.0 (a server listening everywhere) means this machine.
    """
    raw = (host if host is not None else os.environ.get("OLLAMA_HOST", "")).strip()
    if not raw:
        return f"http://127.0.0.1:{DEFAULT_PORT}"
    has_scheme = "://" in raw
    parts = urlsplit(raw if has_scheme else f"http://{raw}")
    scheme = parts.scheme or "http"
    hostname = parts.hostname or "127.0.0.1"
    if hostname in ("0.0.0.0", "::"):
        hostname = "127.0.0.1"
    try:
        port = parts.port
    except ValueError as exc:
        raise RuntimeUnavailable(f"OLLAMA_HOST={raw!r} has a bad port", hint="set it to host:port") from exc
    if port is None:
        port = (443 if scheme == "https" else 80) if has_scheme else DEFAULT_PORT
    if ":" in hostname:
        hostname = f"[{hostname}]"
    return f"{scheme}://{hostname}:{port}{parts.path.rstrip('/')}"


@dataclass(frozen=True)
class OllamaModel:
    """One entry of Ollama's model list (``/api/tags``)."""

    name: str
    size: int = 0
    digest: str = ""
    modified_at: str = ""
    family: str = ""
    parameter_size: str = ""
    quantization_level: str = ""


@dataclass(frozen=True)
class PullProgress:
    """One status line of an Ollama pull."""

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None

    @property
    def fraction(self) -> float | None:
        return self.completed / self.total if self.total and self.completed is not None else None


class OllamaClient:
    """The few Ollama routes localrun uses, with errors mapped to the localrun tree."""

    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.BaseTransport | None = None,
        read_timeout_s: float = 600.0,
        connect_timeout_s: float = 2.0,
    ):
        self.base_url = base_url
        self._http = httpx.Client(
            base_url=base_url, transport=transport, timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        )

    def close(self) -> None:
        self._http.close()

    def _down(self, exc: Exception) -> RuntimeUnavailable:
        return RuntimeUnavailable(f"no Ollama server at {self.base_url} ({type(exc).__name__})", hint=START_HINT)

    def _check(self, response: httpx.Response, model: str) -> None:
        if response.status_code < 400:
            return
        message = error_message(response) or f"HTTP {response.status_code}"
        if response.status_code == 404 and model:
            raise ModelNotFound(f"Ollama has no model {model!r} ({message})", hint=f"run `ollama pull {model}`")
        if response.status_code == 404:
            raise RuntimeUnavailable(
                f"{response.url} answered 404: is {self.base_url} an Ollama server?", hint="check OLLAMA_HOST"
            )
        if response.status_code == 400 and CONTEXT_WORDS.search(message):
            raise ContextOverflow(f"Ollama: {message}", hint="shorten the conversation or raise the context length")
        if response.status_code == 400:
            raise UnsupportedFeature(f"Ollama refused the request for {model!r}: {message}")
        raise LocalrunError(f"Ollama answered {response.status_code} for {model!r}: {message}")

    def request(self, method: str, path: str, *, model: str = "", timeout: float | None = None, **kw: Any) -> Any:
        try:
            response = self._http.request(method, path, timeout=timeout or httpx.USE_CLIENT_DEFAULT, **kw)
        except httpx.TransportError as exc:
            raise self._down(exc) from exc
        self._check(response, model)
        try:
            return response.json()
        except ValueError as exc:
            raise LocalrunError(f"{self.base_url}{path} is not JSON: is this an Ollama server?") from exc

    def version(self) -> str | None:
        """The server's version, or None when it does not say (a proxy that hides the route)."""
        try:
            response = self._http.get("/api/version")
        except httpx.TransportError as exc:
            raise self._down(exc) from exc
        try:
            version = response.json().get("version") if response.status_code == 200 else None
        except (ValueError, AttributeError):
            version = None
        if version is None:
            log.warning("Ollama at %s did not tell its version (HTTP %s)", self.base_url, response.status_code)
        return version

    def stream(
        self, path: str, body: dict[str, Any], cancel: Cancel, *, model: str
    ) -> Generator[dict[str, Any], None, None]:
        """POST ``body`` and yield the NDJSON objects of the answer; ``cancel`` closes it."""
        try:
            with self._http.stream("POST", path, json=body) as response:
                self._check(response, model)
                with abort_on_cancel(response, cancel):
                    for line in response.iter_lines():
                        if not line.strip():
                            continue
                        try:
                            event = json.loads(line)
                        except ValueError as exc:
                            raise LocalrunError(f"Ollama sent a line that is not JSON: {line[:200]!r}") from exc
                        if isinstance(event, dict) and event.get("error"):
                            raise LocalrunError(f"Ollama failed while running {model!r}: {event['error']}")
                        yield event
        except httpx.ConnectError as exc:
            raise self._down(exc) from exc
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ReadTimeout) as exc:
            if cancel.is_set():
                return
            raise WorkerCrashed(
                f"Ollama broke off the answer for {model!r}: {type(exc).__name__}: {exc}",
                hint="check the Ollama server's log",
            ) from exc
