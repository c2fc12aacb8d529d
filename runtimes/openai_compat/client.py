"""The HTTP side of every OpenAI-compatible server localrun talks to.

(:mod:`localrun.runtimes.pieces` turns what it yields into chunks; :mod:`.sse` parses the events.)

* :func:`abort_on_cancel` shuts a streaming HTTP response's socket the moment a request is
  cancelled, so a read blocked on a slow server (a long prefill) returns at once instead
  of at the next token. Ollama and ``mlc_llm serve`` both stop generating when their
  client goes away.
* :class:`OpenAIClient`, an httpx client for an OpenAI-compatible server (``mlc_llm
  serve``): model list, SSE chat and completion streams, embeddings, errors mapped to the
  localrun error tree.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import socket
import threading
from collections.abc import Iterator, Sequence
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
from localrun.runtimes.openai_compat.sse import iter_sse
from localrun.runtimes.pieces import Piece
from localrun.types import Cancel, Sampling, Usage

log = logging.getLogger(__name__)

#: How often a cancel watcher looks at the flag; also the worst-case cancel latency.
CANCEL_POLL_S = 0.01
#: Servers' wording for a prompt longer than the context (MLC, Ollama, llama-server, vLLM).
CONTEXT_WORDS = re.compile(r"input length limit|context (length|window)|too long|exceeds? the (context|maximum)", re.I)


# --- cancelling a blocked read --------------------------------------------------------


def _shutdown_response(response: httpx.Response) -> None:
    """Wake a thread blocked reading ``response``: shut its socket, then close it."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError as exc:  # already closed by the server: nothing left to wake
            log.debug("socket shutdown on cancel: %s", exc)
    else:
        response.close()


@contextlib.contextmanager
def abort_on_cancel(response: httpx.Response, cancel: Cancel) -> Iterator[None]:
    """While the block runs, a set ``cancel`` shuts the response's connection.

    The reader then sees the stream end or break; callers check ``cancel.is_set()`` to
    tell that apart from a server that went away.
    """
    done = threading.Event()

    def watch() -> None:
        while not done.wait(CANCEL_POLL_S):
            if cancel.is_set():
                _shutdown_response(response)
                return

    watcher = threading.Thread(target=watch, name="cancel-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()


# --- an OpenAI-compatible server ------------------------------------------------------


def sampling_to_openai(s: Sampling) -> dict[str, Any]:
    """The OpenAI request fields for ``s``.

    OpenAI's protocol (and MLC's copy of it) has no ``top_k``, ``min_p`` or multiplicative
    repeat penalty; MLC ignores fields it does not know, so they are left out rather than
    sent to be dropped.
    """
    body: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p}
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if s.max_tokens is not None:
        body["max_tokens"] = s.max_tokens
    return body


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


def raise_for_response(response: httpx.Response, *, server: str, model: str) -> None:
    """Map an error status to the localrun error a person can act on."""
    if response.status_code < 400:
        return
    message = error_message(response) or f"HTTP {response.status_code}"
    if response.status_code == 404:
        raise ModelNotFound(f"{server} has no model {model!r}: {message}")
    if response.status_code in (400, 413, 422) and CONTEXT_WORDS.search(message):
        raise ContextOverflow(f"{server}: {message}", hint="shorten the conversation or load the model with a larger context")
    if response.status_code in (400, 422):
        raise UnsupportedFeature(f"{server} refused the request: {message}")
    raise LocalrunError(f"{server} answered {response.status_code}: {message}")


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
    return Usage(_count(data.get("prompt_tokens")), _count(data.get("completion_tokens")), cached,
                 drafted_tokens=drafted, accepted_tokens=min(accepted, drafted))


def _field(data: dict, outer: str, inner: str) -> Any:
    part = data.get(outer)
    return part.get(inner) if isinstance(part, dict) else None


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return max(0, int(value))


class OpenAIClient:
    """A client for one OpenAI-compatible server, built for streaming.

    ``server`` names the server in error messages ("mlc_llm serve on port 41234").
    """

    def __init__(self, base_url: str, *, server: str, read_timeout_s: float = 600.0,
                 connect_timeout_s: float = 5.0, transport: httpx.BaseTransport | None = None):
        self.server = server
        self.base_url = base_url.rstrip("/")
        timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def models(self, *, timeout_s: float | None = None) -> list[str]:
        try:
            response = self._http.get("/v1/models", timeout=timeout_s or httpx.USE_CLIENT_DEFAULT)
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"{self.server} is not answering at {self.base_url}: {exc}") from exc
        raise_for_response(response, server=self.server, model="*")
        return [m.get("id", "") for m in response.json().get("data", [])]

    def stream(self, path: str, body: dict[str, Any], cancel: Cancel, *, model: str) -> Iterator[Piece]:
        """POST a streaming request; yield one piece per event that carries text or an end."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        try:
            with self._http.stream("POST", path, json=body) as response:
                raise_for_response(response, server=self.server, model=model)
                with abort_on_cancel(response, cancel):
                    yield from self._pieces(response, cancel)
        except httpx.ConnectError as exc:
            raise RuntimeUnavailable(f"{self.server} is not answering at {self.base_url}: {exc}") from exc
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ReadTimeout) as exc:
            if cancel.is_set():
                return
            raise WorkerCrashed(f"{self.server} broke off the stream: {type(exc).__name__}: {exc}") from exc

    def _pieces(self, response: httpx.Response, cancel: Cancel) -> Iterator[Piece]:
        finish: str | None = None
        for event in iter_sse(response.iter_lines()):
            if "error" in event and not event.get("choices"):
                raise LocalrunError(f"{self.server} failed mid-stream: {error_message_from(event)}")
            usage = _usage(event.get("usage"))
            choices = event.get("choices") or []
            if not choices:
                if usage is not None:  # the usage-only event after the last choice
                    yield Piece("", finish_reason=_openai_finish(finish), usage=usage, tokens=0)
                    return
                continue
            choice = choices[0]
            text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            finish = choice.get("finish_reason") or None
            if finish is not None and usage is None:
                # Hold the end back: the usage event follows when the server honours
                # include_usage; without it the stream simply ends after [DONE].
                if text:
                    yield Piece(text)
                continue
            end = _openai_finish(finish) if finish is not None else None
            yield Piece(text, finish_reason=end, usage=usage, tokens=1 if text else 0)
            if end is not None:
                return
        if finish is not None:
            yield Piece("", finish_reason=_openai_finish(finish), tokens=0)

    def embeddings(self, texts: Sequence[str], *, model: str) -> list[list[float]]:
        try:
            response = self._http.post("/v1/embeddings", json={"model": model, "input": list(texts)})
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"{self.server} is not answering at {self.base_url}: {exc}") from exc
        raise_for_response(response, server=self.server, model=model)
        rows = sorted(response.json().get("data", []), key=lambda d: d.get("index", 0))
        return [list(map(float, r["embedding"])) for r in rows]

    def close(self) -> None:
        self._http.close()


def _openai_finish(reason: str | None) -> str:
    if reason == "error":
        raise LocalrunError("the server ended the answer with an error", hint="see the server's log")
    return "length" if reason == "length" else "stop"


def error_message_from(event: dict[str, Any]) -> str:
    err = event.get("error")
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err or event.get("message", event))
