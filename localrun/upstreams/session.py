"""A model served by upstreams, behind the same Session interface as a local runtime.

The manager wraps it in an in-process handle, so upstream models go through the same
routes, admission queue and chunk stream as local ones. Failover happens here, and only
before the first piece of an answer exists: until then nothing can have reached the
client, so a connect error, a timeout, a 5xx, a refused key or a stream that breaks
before its first token is retried on the next candidate. After it, an error ends the
stream (the server sends it as an error event), and the upstream is cooled down so the
next request goes elsewhere.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from localrun.errors import LocalrunError
from localrun.types import AUDIO, VISION, Cancel, ChatRequest, Chunk, CompletionRequest
from localrun.upstreams.pool import Route, UpstreamPool, UpstreamState, affinity_key

log = logging.getLogger(__name__)


def route_capabilities(pool: UpstreamPool, route: Route) -> frozenset[str]:
    """What every upstream of the route honours: a request may land on any of them."""
    from localrun.runtimes.openai_compat.kinds import entry_media, get_kind

    caps: frozenset[str] | None = None
    for name in route.upstreams:
        st = pool.get(name)
        if st is None:
            continue
        kind_caps = get_kind(st.config.kind).capabilities | entry_media(st.models.get(route.model))
        caps = kind_caps if caps is None else caps & kind_caps
    return caps or frozenset()


def route_media(pool: UpstreamPool, route: Route) -> frozenset[str]:
    """``vision`` / ``audio`` where every upstream of the route says its model takes them."""
    return route_capabilities(pool, route) & {VISION, AUDIO}


def _prompt_text(req: ChatRequest | CompletionRequest) -> str:
    if isinstance(req, CompletionRequest):
        return req.prompt
    return "\x1e".join(f"{m.role}\x1f{m.content}" for m in req.messages)


class UpstreamSession:
    """One routed model: chat, completions and embeddings with failover across its upstreams."""

    concurrent = True

    def __init__(self, pool: UpstreamPool, route: Route):
        self.pool = pool
        self.route = route
        self.capabilities = route_capabilities(pool, route)

    def _model_id(self, st: UpstreamState) -> str:
        """The id to send: TGI and TRT-LLM serve one model under whatever id they report."""
        from localrun.runtimes.openai_compat.kinds import get_kind

        if get_kind(st.config.kind).single_model and st.models:
            return next(iter(st.models))
        return self.route.model

    def _wait_s(self) -> float:
        states = [self.pool.get(n) for n in self.route.upstreams]
        return max((st.config.first_byte_timeout_s for st in states if st is not None), default=30.0)

    def _attempts(
        self, path: str, body: Callable[[UpstreamState, str], dict[str, Any]], key: str | None, cancel: Cancel
    ) -> Iterator[Any]:
        """Pieces from the first upstream that starts answering; failover until then."""
        tried: set[str] = set()
        last: LocalrunError | None = None
        while True:
            st = self.pool.acquire(self.route, exclude=tried, key=key, wait_s=self._wait_s(), cancelled=cancel.is_set)
            if st is None:
                assert last is not None
                raise last
            tried.add(st.name)
            started = time.perf_counter()
            try:
                pieces = st.client.stream(path, body(st, self._model_id(st)), cancel, model=self.route.name)
                first = next(pieces, None)
            except LocalrunError as exc:
                self.pool.release(st)
                self.pool.mark_failure(st, self.route.model, exc)
                last = exc
                if getattr(exc, "retryable", False) and not cancel.is_set():
                    log.warning("%s: retrying on another upstream: %s", self.route.name, exc.message)
                    continue
                raise
            self.pool.observe(st.name, self.route.model, "first_byte", seconds=time.perf_counter() - started)
            yield from self._rest(st, first, pieces, started)
            return

    def _rest(self, st: UpstreamState, first: Any, pieces: Generator[Any, None, None], started: float) -> Iterator[Any]:
        outcome = "ok"
        try:
            if first is not None:
                yield first
            yield from pieces
            self.pool.mark_success(st)  # the whole answer came: as good as a passing probe
        except LocalrunError as exc:
            outcome = "error"
            self.pool.mark_failure(st, self.route.model, exc)
            raise
        finally:
            pieces.close()
            self.pool.release(st)
            self.pool.observe(st.name, self.route.model, "done", seconds=time.perf_counter() - started, outcome=outcome)

    def _stream(
        self,
        path: str,
        req: ChatRequest | CompletionRequest,
        body: Callable[[UpstreamState, str], dict[str, Any]],
        cancel: Cancel,
    ) -> Iterator[Chunk]:
        from localrun.runtimes.pieces import shape_stream

        key = affinity_key(_prompt_text(req), self.pool.settings.affinity_prefix_chars)
        # The upstream applies the stop strings itself; shape_stream adds cancel and the last chunk.
        return shape_stream(self._attempts(path, body, key, cancel), stops=(), cancel=cancel)

    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        from localrun.runtimes.openai_compat.wire import chat_body

        return self._stream("/v1/chat/completions", req, lambda st, m: chat_body(req, st.client.kind, m), cancel)

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        from localrun.runtimes.openai_compat.wire import completion_body

        return self._stream("/v1/completions", req, lambda st, m: completion_body(req, st.client.kind, m), cancel)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return self._embed(texts)[0]

    def serve_embed_usage(self, inputs: Sequence[str]) -> dict[str, Any]:
        """Vectors with the upstream's own count of the tokens they took (the embeddings routes' usage)."""
        vectors, tokens = self._embed(inputs)
        return {"embeddings": vectors, "prompt_tokens": tokens}

    def _embed(self, texts: Sequence[str]) -> tuple[list[list[float]], int]:
        from localrun.errors import UnsupportedFeature

        if "embeddings" not in self.capabilities:
            raise UnsupportedFeature(
                f"embeddings are not supported by the upstreams serving {self.route.name}", param="input"
            )
        tried: set[str] = set()
        last: LocalrunError | None = None
        while True:
            st = self.pool.acquire(self.route, exclude=tried, key=None, wait_s=self._wait_s())
            if st is None:
                assert last is not None
                raise last
            tried.add(st.name)
            try:
                answer: tuple[list[list[float]], int] = st.client.embeddings(texts, model=self._model_id(st))
                self.pool.mark_success(st)
                return answer
            except LocalrunError as exc:
                self.pool.mark_failure(st, self.route.model, exc)
                last = exc
                if not getattr(exc, "retryable", False):
                    raise
            finally:
                self.pool.release(st)

    def close(self) -> None:
        """The pool owns the clients; a session holds nothing of its own."""
