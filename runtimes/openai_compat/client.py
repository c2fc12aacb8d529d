"""The one client for an OpenAI-compatible server, whoever runs it.

One state machine reads every OpenAI-compatible stream localrun consumes: the engines it
supervises (``mlc_llm serve``, vLLM: :mod:`.supervisor`) and the upstreams it routes to
(:mod:`localrun.upstreams`). What differs is an option, not a second class:

* **errors**: an engine's client (no ``upstream`` name) maps failures to the runtime errors
  (:class:`~localrun.errors.RuntimeUnavailable` when it does not answer,
  :class:`~localrun.errors.WorkerCrashed` when a stream breaks, which the supervisor turns
  into a restart); an upstream's client maps them to :class:`.kinds.UpstreamError` and its
  subclasses, whose ``retryable`` flag drives failover.
* **timeouts**: a watchdog (one thread per client for all its streams) shuts a stream that
  sends nothing for ``first_byte_s`` before its first event (the prefill) or ``chunk_s``
  between events; a cancel (the client went away) shuts the socket at once, which makes
  every engine stop generating.
* **key**: sent as a Bearer token to this server only, and scrubbed from any text that
  leaves this module.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from localrun.errors import (
    ContextOverflow,
    LocalrunError,
    ModelNotFound,
    RuntimeUnavailable,
    UnsupportedFeature,
    WorkerCrashed,
)
from localrun.runtimes.openai_compat.kinds import (
    CONTEXT_WORDS,
    Kind,
    UpstreamError,
    UpstreamTimeout,
    error_text,
    scrub,
    status_error,
)
from localrun.runtimes.openai_compat.sse import iter_sse
from localrun.runtimes.openai_compat.watch import Timeouts, Watchdog, WatchHub
from localrun.runtimes.openai_compat.wire import ToolCalls, chat_logprobs
from localrun.runtimes.pieces import Piece
from localrun.types import Cancel, Usage

log = logging.getLogger(__name__)
# One shared default: the call in a default argument ran once at import anyway.
DEFAULT_TIMEOUTS = Timeouts()


def error_message(response: httpx.Response) -> str:
    """The server's own words for an error response (OpenAI, MLC and Ollama shapes)."""
    try:
        response.read()
    except httpx.HTTPError as exc:
        return f"(no body: {type(exc).__name__})"
    try:
        data = response.json()
    except ValueError:
        return response.text.strip()[:500]
    if isinstance(data, dict):
        err = data.get("error", data.get("message"))
        if isinstance(err, dict):
            err = err.get("message")
        if err:
            return str(err)[:500]
    return json.dumps(data)[:500]


def engine_status_error(response: httpx.Response, *, server: str, model: str) -> LocalrunError:
    """The localrun error a person can act on for an engine's error status."""
    message = error_message(response) or f"HTTP {response.status_code}"
    if response.status_code == 404:
        return ModelNotFound(f"{server} has no model {model!r}: {message}")
    if response.status_code in (400, 413, 422) and CONTEXT_WORDS.search(message):
        return ContextOverflow(
            f"{server}: {message}", hint="shorten the conversation or load the model with a larger context"
        )
    if response.status_code in (400, 422):
        return UnsupportedFeature(f"{server} refused the request: {message}")
    return LocalrunError(f"{server} answered {response.status_code}: {message}")


def _usage(data: Any) -> Usage | None:
    """The usage an OpenAI-compatible server reported. Drafting counts come from localrun's
    ``speculative`` extension, else from OpenAI's prediction fields (accepted + rejected);
    a count that is not a number is taken as 0, never an error."""
    if not isinstance(data, dict):
        return None
    cached = _count(_field(data, "prompt_tokens_details", "cached_tokens"))
    spec = data.get("speculative")
    if isinstance(spec, dict):
        drafted, accepted = _count(spec.get("drafted_tokens")), _count(spec.get("accepted_tokens"))
    else:
        accepted = _count(_field(data, "completion_tokens_details", "accepted_prediction_tokens"))
        drafted = accepted + _count(_field(data, "completion_tokens_details", "rejected_prediction_tokens"))
    return Usage(
        _count(data.get("prompt_tokens")),
        _count(data.get("completion_tokens")),
        cached,
        drafted_tokens=drafted,
        accepted_tokens=min(accepted, drafted),
    )


def _field(data: dict[str, Any], outer: str, inner: str) -> Any:
    part = data.get(outer)
    return part.get(inner) if isinstance(part, dict) else None


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return max(0, int(value))


@dataclass(frozen=True)
class Probe:
    """One health probe: did it pass, how long it took, and the server's words if it failed."""

    ok: bool
    latency_s: float
    detail: str = ""


class OpenAIClient:
    """One OpenAI-compatible server: its own httpx connection pool, streams under one watchdog.

    ``server`` names it in error messages ("mlc_llm serve on port 41234", "upstream 'gpu1'").
    ``upstream`` (the configured name) makes its errors upstream errors, for failover; ``kind``
    is the engine's dialect (health and version endpoints); ``key`` is sent and scrubbed.
    """

    def __init__(
        self,
        base_url: str,
        *,
        server: str,
        kind: Kind | None = None,
        upstream: str | None = None,
        key: str | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        verify: bool | Any = True,
        transport: httpx.BaseTransport | None = None,
    ):
        self.server, self.url, self.kind, self.timeouts = server, base_url.rstrip("/"), kind, timeouts
        self.upstream = upstream
        self._secrets = (key,) if key else ()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        timeout = httpx.Timeout(
            max(timeouts.first_byte_s, timeouts.chunk_s), connect=timeouts.connect_s, pool=timeouts.first_byte_s
        )
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._watch = WatchHub()
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=timeout,
            verify=verify,
            transport=transport,
            limits=limits,
            follow_redirects=False,
        )

    @property
    def base_url(self) -> str:
        return self.url

    def scrub(self, text: str) -> str:
        return scrub(text, self._secrets)

    # -- the two error dialects ----------------------------------------------------------
    def _transport_error(self, exc: httpx.HTTPError, *, during: str) -> LocalrunError:
        """Not answering: connect refused, timed out, or the connection dropped before an answer."""
        text = self.scrub(f"{type(exc).__name__}: {exc}")
        if self.upstream is None:
            if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
                return RuntimeUnavailable(f"{self.server} is not answering at {self.url}: {text}")
            return WorkerCrashed(f"{self.server} broke off the stream: {text}")
        if isinstance(exc, httpx.TimeoutException):
            what = "connect" if isinstance(exc, httpx.ConnectTimeout) else "first byte"
            return UpstreamTimeout(
                f"{self.server} timed out ({what}) during {during}: {text}", status=504, retryable=True, kind="timeout"
            )
        kind = "connect" if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)) else "stream"
        return UpstreamError(
            f"{self.server} at {self.url} is not answering ({during}): {text}",
            status=503,
            retryable=True,
            kind=kind,
            hint="`localrun upstream check` probes it",
        )

    def _status_error(self, response: httpx.Response, *, model: str) -> LocalrunError:
        response.read()
        if self.upstream is None:
            return engine_status_error(response, server=self.server, model=model)
        return status_error(
            response.status_code,
            response.content,
            upstream=self.upstream,
            model=model,
            secrets=self._secrets,
            retry_after=response.headers.get("retry-after"),
        )

    def _stream_error(self, message: str, *, retryable: bool = True, status: int = 502) -> LocalrunError:
        """A stream that broke, ended early or made no sense; for an engine, a retryable one may be its crash
        (the supervisor looks), the others are the engine's own answer."""
        if self.upstream is None:
            return WorkerCrashed(f"{self.server} {message}") if retryable else LocalrunError(f"{self.server} {message}")
        return UpstreamError(f"{self.server} {message}", status=status, retryable=retryable, kind="stream")

    def _timeout(self, watchdog: Watchdog) -> LocalrunError:
        limit = self.timeouts.first_byte_s if watchdog.fired == "first byte" else self.timeouts.chunk_s
        message = f"{self.server} sent nothing for {limit:g} s ({watchdog.fired})"
        if self.upstream is None:
            return WorkerCrashed(message)
        return UpstreamTimeout(message, status=504, retryable=True, kind="timeout")

    def _finish(self, reason: str) -> str:
        if reason == "error":
            if self.upstream is None:
                raise LocalrunError(f"{self.server} ended the answer with an error", hint="see the server's log")
            raise UpstreamError(f"{self.server} ended the answer with an error", kind="stream")
        return "length" if reason == "length" else "stop"

    # -- plain requests ------------------------------------------------------------------
    def _get_json(self, path: str, timeout_s: float) -> Any:
        try:
            response = self._http.get(path, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, during=f"GET {path}") from None
        if response.status_code >= 400:
            raise self._status_error(response, model="*")
        return response.json() if response.content else {}

    def models(self, *, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """``/v1/models``' entries (id plus whatever the engine adds, e.g. vLLM's max_model_len)."""
        data = self._get_json("/v1/models", timeout_s)
        rows = data.get("data") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise self._stream_error(
                "answered /v1/models with something that is not an OpenAI model list", retryable=False
            )
        rows = [r for r in rows if isinstance(r, dict) and isinstance(r.get("id"), str)]
        # llama-server says what a model takes in an Ollama-shaped "models" list beside "data"
        # (capabilities ["completion", "multimodal"]): carry it onto the entry of that id.
        listed = data.get("models") if isinstance(data.get("models"), list) else []
        caps = {m.get("model"): m["capabilities"] for m in listed if isinstance(m, dict) and "capabilities" in m}
        return [{"capabilities": caps[r["id"]], **r} if r["id"] in caps else r for r in rows]

    def probe(self, *, timeout_s: float = 3.0) -> Probe:
        """GET the kind's own health endpoint: a 2xx passes (LMDeploy's body must not say unhealthy)."""
        t0 = time.monotonic()
        try:
            response = self._http.get(self.kind.health_path if self.kind else "/v1/models", timeout=timeout_s)
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
        if self.kind is None or not self.kind.version_path:
            return None
        try:
            data = self._get_json(self.kind.version_path, timeout_s)
        except (LocalrunError, ValueError) as exc:
            log.debug("%s tells no version: %s", self.server, exc)
            return None
        value = data.get("localrun") or data.get("version") if isinstance(data, dict) else None
        return str(value) if value else None

    def embeddings(self, texts: Sequence[str], *, model: str) -> tuple[list[list[float]], int]:
        """The vectors, and the prompt tokens the server reports for them (0 when it reports none)."""
        try:
            response = self._http.post("/v1/embeddings", json={"model": model, "input": list(texts)})
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, during="POST /v1/embeddings") from None
        if response.status_code >= 400:
            raise self._status_error(response, model=model)
        try:
            data = response.json()
            rows = sorted(data.get("data", []), key=lambda d: d.get("index", 0))
            tokens = int((data.get("usage") or {}).get("prompt_tokens") or 0)
            return [list(map(float, r["embedding"])) for r in rows], tokens
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self._stream_error(f"sent embeddings localrun cannot read: {exc}", retryable=False) from None

    # -- streams -------------------------------------------------------------------------
    def stream(self, path: str, body: dict[str, Any], cancel: Cancel, *, model: str) -> Generator[Piece, None, None]:
        """POST a streaming request; yield a piece per event that carries text, and one at the end.

        Raises:
            LocalrunError: connect failure, HTTP error (mapped per status), a timeout, a stream
                that breaks off or is not valid SSE, or an error event in the stream — upstream
                errors for an upstream's client, runtime errors for an engine's.
        """
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        started = time.monotonic()
        try:
            with self._http.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    raise self._status_error(response, model=model)
                watchdog = Watchdog(response, cancel, self.timeouts, started, self._watch)
                try:
                    yield from self._pieces(response, watchdog, cancel)
                except httpx.HTTPError as exc:
                    if cancel.is_set():
                        return
                    if watchdog.fired:
                        raise self._timeout(watchdog) from None
                    why = self.scrub(str(exc)) or type(exc).__name__
                    raise self._stream_error(f"broke off the stream: {why}") from None
                finally:
                    watchdog.stop()
        except httpx.HTTPError as exc:
            if cancel.is_set():
                return
            raise self._transport_error(exc, during=f"POST {path}") from None

    def _events(self, lines: Iterator[str]) -> Iterator[dict[str, Any]]:
        events = iter_sse(lines)
        while True:
            try:
                event = next(events)
            except StopIteration:
                return
            except ValueError as exc:  # json.JSONDecodeError: not an event stream
                raise self._stream_error(f"sent a broken event stream: {exc}") from None
            if not isinstance(event, dict):
                raise self._stream_error("sent an event that is not an object")
            if "error" in event and not event.get("choices"):
                message, _ = error_text(json.dumps(event))
                raise self._stream_error(f"failed mid-stream: {self.scrub(message)}", retryable=False)
            yield event

    def _pieces(self, response: httpx.Response, watchdog: Watchdog, cancel: Cancel) -> Iterator[Piece]:
        """The one state machine: text and log-probabilities as they come, tool-call deltas joined,
        the end held back until the usage event (``include_usage``) or the end of the stream."""
        finish: str | None = None
        calls = ToolCalls()
        lines = _watched_lines(response, watchdog)
        for event in self._events(lines):
            usage = _usage(event.get("usage"))
            choices = event.get("choices") or []
            if not choices:
                # The usage-only event after the last choice (an engine may send it with no finish).
                if usage is not None and (finish is not None or self.upstream is None):
                    _drain(lines)
                    yield Piece(
                        "", finish_reason=self._finish(finish or "stop"), usage=usage, tokens=0, tool_calls=calls.done()
                    )
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
                yield Piece(
                    text,
                    finish_reason=self._finish(str(finish)),
                    usage=usage,
                    tokens=1 if text else 0,
                    logprobs=lp,
                    tool_calls=calls.done(),
                )
                return
            if text or lp:
                yield Piece(text, logprobs=lp)
        if finish is None:
            if cancel.is_set():
                return
            if watchdog.fired:  # the watchdog shut the socket: the stream ended rather than broke
                raise self._timeout(watchdog)
            if self.upstream is None:
                return  # an engine that just stops sending: shape_stream ends the answer
            raise self._stream_error("ended the stream without finishing the answer", status=502)
        yield Piece("", finish_reason=self._finish(finish), tokens=0, tool_calls=calls.done())

    def close(self) -> None:
        self._http.close()


def _drain(lines: Iterator[str], limit: int = 8) -> None:
    """Read what follows the last event (``[DONE]``, the end of the body), so the connection
    goes back to the pool instead of being closed; a server that keeps talking is cut off."""
    for i, _ in enumerate(lines):
        if i >= limit:
            return


def _watched_lines(response: httpx.Response, watchdog: Watchdog) -> Iterator[str]:
    for line in response.iter_lines():
        watchdog.event()
        yield line
