"""The HTTP side of an upstream: one httpx client per configured server.

:class:`UpstreamClient` sends chat, completion and embedding requests to one upstream and
turns its SSE answer into :class:`~localrun.runtimes.openai_compat.client.Piece` objects (text,
tool-call deltas gathered, log-probabilities, usage), the same pieces the MLC runtime
feeds :func:`~localrun.runtimes.openai_compat.client.shape_stream`. Routing, failover and health
are the core's (:mod:`localrun.upstreams.pool`); this module only talks to one server.

Three timeouts guard a request: connect, first byte (from sending to the first event,
which covers the prefill), and between chunks. A watchdog thread enforces the last two,
and a cancel (the client went away) shuts the socket at once, which makes every engine
stop generating. The key is sent to this upstream only, and scrubbed from any text that
leaves this module.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from localrun.errors import LocalrunError
from localrun.runtimes.openai_compat.client import _shutdown_response, _usage
from localrun.runtimes.openai_compat.sse import iter_sse
from localrun.runtimes.pieces import Piece
from localrun.runtimes.openai_compat.kinds import Kind, UpstreamError, UpstreamTimeout, error_text, scrub, status_error
from localrun.runtimes.openai_compat.wire import ToolCalls, chat_logprobs
from localrun.types import Cancel

log = logging.getLogger(__name__)

WATCH_POLL_S = 0.02


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 5.0
    first_byte_s: float = 120.0
    chunk_s: float = 60.0


@dataclass(frozen=True)
class Probe:
    """One health probe: did it pass, how long it took, and the server's words if it failed."""

    ok: bool
    latency_s: float
    detail: str = ""


class _Watchdog:
    """One stream's guard: shut it when the request is cancelled or the upstream goes quiet."""

    def __init__(self, response: httpx.Response, cancel: Cancel, timeouts: Timeouts, started: float, hub: "_WatchHub"):
        self.response, self.cancel, self.timeouts = response, cancel, timeouts
        self.started = started
        self.last_event: float | None = None
        self.fired: str | None = None  # "first byte" | "between chunks" once it shut the stream
        self._hub = hub
        hub.add(self)

    def event(self) -> None:
        self.last_event = time.monotonic()

    def check(self, now: float) -> bool:
        """Shut the stream if it is due; True once this guard has nothing more to do."""
        if self.cancel.is_set():
            _shutdown_response(self.response)
            return True
        if self.last_event is None and now - self.started > self.timeouts.first_byte_s:
            self.fired = "first byte"
        elif self.last_event is not None and now - self.last_event > self.timeouts.chunk_s:
            self.fired = "between chunks"
        if self.fired:
            _shutdown_response(self.response)
            return True
        return False

    def stop(self) -> None:
        self._hub.remove(self)


class _WatchHub:
    """One thread per upstream client checks all its open streams (not a thread per request)."""

    def __init__(self) -> None:
        self._items: set[_Watchdog] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, w: _Watchdog) -> None:
        with self._lock:
            self._items.add(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="upstream-watch", daemon=True)
                self._thread.start()

    def remove(self, w: _Watchdog) -> None:
        with self._lock:
            self._items.discard(w)

    def _run(self) -> None:
        idle = 0
        while True:
            time.sleep(WATCH_POLL_S)
            with self._lock:
                items = list(self._items)
                if not items:
                    idle += 1
                    if idle * WATCH_POLL_S >= 2.0:  # nothing open for a while: the thread ends
                        self._thread = None
                        return
                    continue
            idle = 0
            now = time.monotonic()
            for w in items:
                if w.check(now):
                    self.remove(w)


class UpstreamClient:
    """One upstream server: its kind, its key, its own httpx connection pool."""

    def __init__(self, name: str, url: str, kind: Kind, *, key: str | None = None, timeouts: Timeouts = Timeouts(),
                 verify: bool | str = True, transport: httpx.BaseTransport | None = None):
        self.name, self.url, self.kind, self.timeouts = name, url.rstrip("/"), kind, timeouts
        self._secrets = (key,) if key else ()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        timeout = httpx.Timeout(max(timeouts.first_byte_s, timeouts.chunk_s), connect=timeouts.connect_s, pool=timeouts.first_byte_s)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._watch = _WatchHub()
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=verify,
                                  transport=transport, limits=limits, follow_redirects=False)

    def scrub(self, text: str) -> str:
        return scrub(text, self._secrets)

    def _transport_error(self, exc: httpx.HTTPError, *, during: str) -> UpstreamError:
        text = self.scrub(f"{type(exc).__name__}: {exc}")
        if isinstance(exc, httpx.TimeoutException):
            what = "connect" if isinstance(exc, httpx.ConnectTimeout) else "first byte"
            return UpstreamTimeout(f"upstream {self.name!r} timed out ({what}) during {during}: {text}", status=504,
                                   retryable=True, kind="timeout")
        kind = "connect" if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)) else "stream"
        return UpstreamError(f"upstream {self.name!r} at {self.url} is not answering ({during}): {text}", status=503,
                             retryable=True, kind=kind, hint="`localrun upstream check` probes it")

    def _get_json(self, path: str, timeout_s: float) -> Any:
        try:
            response = self._http.get(path, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, during=f"GET {path}") from None
        if response.status_code >= 400:
            raise status_error(response.status_code, response.content, upstream=self.name, model="*", secrets=self._secrets)
        return response.json() if response.content else {}

    def models(self, *, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """``/v1/models``' entries (id plus whatever the engine adds, e.g. vLLM's max_model_len)."""
        data = self._get_json("/v1/models", timeout_s)
        rows = data.get("data") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise UpstreamError(f"upstream {self.name!r}: /v1/models is not an OpenAI model list")
        return [r for r in rows if isinstance(r, dict) and isinstance(r.get("id"), str)]

    def probe(self, *, timeout_s: float = 3.0) -> Probe:
        """GET the kind's own health endpoint: a 2xx passes (LMDeploy's body must not say unhealthy)."""
        t0 = time.monotonic()
        try:
            response = self._http.get(self.kind.health_path, timeout=timeout_s)
        except httpx.HTTPError as exc:
            return Probe(False, time.monotonic() - t0, self.scrub(f"{type(exc).__name__}: {exc}"))
        latency = time.monotonic() - t0
        if response.status_code >= 400:
            return Probe(False, latency, f"HTTP {response.status_code}: {self.scrub(error_text(response.content)[0])}")
        if b"unhealthy" in response.content[:200]:
            return Probe(False, latency, self.scrub(response.text[:200]))
        return Probe(True, latency)

    def version(self, *, timeout_s: float = 3.0) -> str | None:
        """The engine's version where it tells one (vLLM /version, TGI /info, Ollama, localrun)."""
        if not self.kind.version_path:
            return None
        try:
            data = self._get_json(self.kind.version_path, timeout_s)
        except (LocalrunError, ValueError) as exc:
            log.debug("upstream %s tells no version: %s", self.name, exc)
            return None
        value = data.get("localrun") or data.get("version") if isinstance(data, dict) else None
        return str(value) if value else None

    def stream(self, path: str, body: dict[str, Any], cancel: Cancel, *, model: str) -> Iterator[Piece]:
        """POST a streaming request; yield a piece per event that carries text, and one at the end.

        Raises:
            UpstreamError: connect failure, HTTP error (mapped per status), a timeout, a stream
                that breaks off or is not valid SSE, or an error event in the stream.
        """
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        started = time.monotonic()
        try:
            with self._http.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise status_error(response.status_code, response.content, upstream=self.name, model=model,
                                       secrets=self._secrets, retry_after=response.headers.get("retry-after"))
                watchdog = _Watchdog(response, cancel, self.timeouts, started, self._watch)
                try:
                    yield from self._pieces(response, watchdog, cancel)
                except httpx.HTTPError as exc:
                    if cancel.is_set():
                        return
                    if watchdog.fired:
                        raise self._timeout(watchdog) from None
                    raise UpstreamError(f"upstream {self.name!r} broke off the stream: {self.scrub(str(exc)) or type(exc).__name__}",
                                        status=502, retryable=True, kind="stream") from None
                finally:
                    watchdog.stop()
        except httpx.HTTPError as exc:
            if cancel.is_set():
                return
            raise self._transport_error(exc, during=f"POST {path}") from None

    def _timeout(self, watchdog: _Watchdog) -> UpstreamTimeout:
        limit = self.timeouts.first_byte_s if watchdog.fired == "first byte" else self.timeouts.chunk_s
        return UpstreamTimeout(f"upstream {self.name!r} sent nothing for {limit:g} s ({watchdog.fired})", status=504,
                               retryable=True, kind="timeout")

    def _pieces(self, response: httpx.Response, watchdog: _Watchdog, cancel: Cancel) -> Iterator[Piece]:
        finish: str | None = None
        calls = ToolCalls()
        lines = _watched_lines(response, watchdog)
        events = iter_sse(lines)
        while True:
            try:
                event = next(events)
            except StopIteration:
                break
            except ValueError as exc:  # json.JSONDecodeError: not an event stream
                raise UpstreamError(f"upstream {self.name!r} sent a broken event stream: {exc}", status=502,
                                    retryable=True, kind="stream") from None
            if not isinstance(event, dict):
                raise UpstreamError(f"upstream {self.name!r} sent an event that is not an object", retryable=True, kind="stream")
            if "error" in event and not event.get("choices"):
                message, _ = error_text(json.dumps(event))
                raise UpstreamError(f"upstream {self.name!r} failed mid-stream: {self.scrub(message)}", kind="stream")
            usage = _usage(event.get("usage"))
            choices = event.get("choices") or []
            if not choices:
                if usage is not None and finish is not None:
                    _drain(lines)
                    yield Piece("", finish_reason=_finish(finish), usage=usage, tokens=0, tool_calls=calls.done())
                    return
                continue
            choice = choices[0]
            delta = choice.get("delta") or {}
            text = delta.get("content") or choice.get("text") or ""
            if delta.get("tool_calls"):
                calls.add(delta["tool_calls"])
            lp = chat_logprobs(choice.get("logprobs"))
            finish = choice.get("finish_reason") or finish
            if choice.get("finish_reason") and usage is None:
                if text or lp:
                    yield Piece(text, logprobs=lp)
                continue  # the usage event follows (include_usage); else the stream ends at [DONE]
            if choice.get("finish_reason"):
                _drain(lines)
                yield Piece(text, finish_reason=_finish(finish), usage=usage, tokens=1 if text else 0, logprobs=lp,
                            tool_calls=calls.done())
                return
            if text or lp:
                yield Piece(text, logprobs=lp)
        if finish is None:
            if cancel.is_set():
                return
            if watchdog.fired:  # the watchdog shut the socket: the stream ended rather than broke
                raise self._timeout(watchdog)
            raise UpstreamError(f"upstream {self.name!r} ended the stream without finishing the answer",
                                retryable=True, kind="stream")
        yield Piece("", finish_reason=_finish(finish), tokens=0, tool_calls=calls.done())

    def embeddings(self, texts: Sequence, *, model: str) -> tuple[list[list[float]], int]:
        """The vectors, and the prompt tokens the upstream reports for them (0 when it reports none)."""
        try:
            response = self._http.post("/v1/embeddings", json={"model": model, "input": list(texts)})
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, during="POST /v1/embeddings") from None
        if response.status_code >= 400:
            raise status_error(response.status_code, response.content, upstream=self.name, model=model,
                               secrets=self._secrets, retry_after=response.headers.get("retry-after"))
        try:
            data = response.json()
            rows = sorted(data.get("data", []), key=lambda d: d.get("index", 0))
            tokens = int((data.get("usage") or {}).get("prompt_tokens") or 0)
            return [list(map(float, r["embedding"])) for r in rows], tokens
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UpstreamError(f"upstream {self.name!r} sent embeddings localrun cannot read: {exc}") from None

    def close(self) -> None:
        self._http.close()


def _drain(lines: Iterator[str], limit: int = 8) -> None:
    """Read what follows the last event (``[DONE]``, the end of the body), so the connection
    goes back to the pool instead of being closed; a server that keeps talking is cut off."""
    for i, _ in enumerate(lines):
        if i >= limit:
            return


def _watched_lines(response: httpx.Response, watchdog: _Watchdog) -> Iterator[str]:
    for line in response.iter_lines():
        watchdog.event()
        yield line


def _finish(reason: str) -> str:
    if reason == "error":
        raise UpstreamError("the upstream ended the answer with an error", kind="stream")
    return "length" if reason == "length" else "stop"
