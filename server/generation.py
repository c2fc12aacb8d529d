"""What every wire family's routes share once a body is parsed (:mod:`.fields` parses it):
sampling options, opening a generation, and reading its chunks while watching the client.

A :class:`Generation` wraps the manager's ``OpenStream``. Its first chunk is read before
the response starts, so an error the runtime raises at once (context overflow, template
error) is still a proper HTTP status. While waiting for that chunk — or for a whole
non-streamed answer — it watches the connection: a client that leaves cancels the work in
the worker. Once streaming, Starlette cancels the body iterator on disconnect, and the
cancellation runs the stream's ``finally`` blocks, which tell the worker to stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from starlette.datastructures import State
from starlette.requests import Request

from localrun.chat.constraints import OPENAI, ConstraintNames, check_request
from localrun.chat.tool_checks import check_tool_calls
from localrun.errors import Cancelled, LocalrunError
from localrun.server.errors import InvalidRequest
from localrun.server.fields import note_ignored, refuse_unsupported
from localrun.server.metrics import STATS_KEY, Metrics, RequestStats
from localrun.server.tool_events import CallEvents
from localrun.types import AUDIO, VISION, ChatRequest, Chunk, CompletionRequest, ModelRecord, Plan, Sampling, Usage

if TYPE_CHECKING:
    from localrun.activity import OpenStream

T = TypeVar("T")

log = logging.getLogger(__name__)


def app_state(request: Request) -> State:
    state: State = request.app.state
    return state


def request_stats(request: Request) -> RequestStats:
    stats = request.scope.get(STATS_KEY)
    if stats is None:  # app used without the Observe middleware (unit tests)
        stats = request.scope[STATS_KEY] = RequestStats()
    return stats


def clamp_max_tokens(requested: int | None, cap: int) -> int | None:
    """A request's max_tokens bounded by the server's cap; None when none was asked, for the manager
    to fill by the model (a small cap in completion mode, the cap otherwise: localrun/activity.py's
    ``answer_limit``). A limit of 0 or below (Ollama's ``num_predict: -1``, llama-server's
    ``n_predict: -1``) asks for no limit: the cap."""
    if requested is None:
        return None
    if requested <= 0:
        return cap
    return min(requested, cap)


def stop_tuple(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def logprobs_asked(logprobs: bool | None, top: int | None) -> int | None:
    """``Sampling.logprobs`` from the OpenAI and Ollama knobs: None (off) or how many top
    alternatives; ``top_logprobs`` alone is a 400 on both APIs."""
    if top is not None and not logprobs:
        raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if logprobs else None


def make_sampling(
    *,
    cap: int,
    max_tokens: int | None = None,
    seed: int | None = None,
    stop: str | list[str] | None = None,
    **knobs: Any,
) -> Sampling:
    """Sampling from request fields; unset knobs keep the runtime defaults in ``Sampling``."""
    fields: dict[str, Any] = {k: v for k, v in knobs.items() if v is not None}
    fields["max_tokens"] = clamp_max_tokens(max_tokens, cap)
    fields["stop"] = stop_tuple(stop)
    if seed is not None:
        fields["seed"] = seed % 2**32
    return Sampling(**fields)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ClientGone(Cancelled):
    """The client closed the connection before the answer was ready."""


class Generation:
    """An admitted request being answered. Feeds per-request stats and the ITL histogram."""

    def __init__(
        self, request: Request, stream: OpenStream, *, metrics: Metrics, tools: tuple[dict[str, Any], ...] = ()
    ) -> None:
        self.request = request
        self.stream = stream
        self.record = stream.record
        self.plan = stream.plan
        self.stats = request_stats(request)
        self.stats.model = stream.record.name
        self.metrics = metrics
        #: The manager's timing of this request (localrun.activity.RequestTiming): the one measure
        #: of its tokens, which the stats copy and whose gaps feed the ITL histogram.
        self.timing = stream.timing
        self.timing.on_gap(metrics.observe_itl)
        self.finish_reason: str | None = None
        self.usage = Usage()
        #: Parsed calls of the answer (from its last chunk); every token's log-probability, for a collected answer.
        self.tool_calls: tuple[dict[str, Any], ...] = ()
        self._tools = tools  # the request's tools: each call is checked against its schema (chat.tool_checks)
        self.logprobs: list[dict[str, Any]] = []
        #: Per choice (``Chunk.index``, OpenAI's ``n``): finish reasons, and for a collected answer texts and logprobs.
        self.finishes: dict[int, str] = {}
        self.texts: dict[int, str] = {}
        self.choice_logprobs: dict[int, list[dict[str, Any]]] = {0: self.logprobs}
        #: The reasoning channel's text so far (localrun.chat.reasoning): empty for other models.
        self.reasoning_parts: list[str] = []
        # OpenStream.__aiter__ is an async generator function (declared to return an AsyncIterator): closable.
        self._iter = cast("AsyncGenerator[Chunk, None]", stream.__aiter__())

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_parts)

    def _note(self, chunk: Chunk) -> None:
        if chunk.reasoning:
            self.reasoning_parts.append(chunk.reasoning)
        if chunk.text or chunk.reasoning or chunk.call_deltas:
            self.stats.first_token_at = self.timing.first_token_at
            self.stats.last_token_at = self.timing.last_token_at
        if chunk.tool_calls:
            check_tool_calls(chunk.tool_calls, self._tools, model=self.record.name)
            self.tool_calls = chunk.tool_calls
        if chunk.usage is not None:
            self.usage = chunk.usage
            self.stats.prompt_tokens = chunk.usage.prompt_tokens
            self.stats.completion_tokens = chunk.usage.completion_tokens
            self.stats.cached_tokens = chunk.usage.cached_tokens
            self.stats.drafted_tokens = chunk.usage.drafted_tokens
            self.stats.accepted_tokens = chunk.usage.accepted_tokens
        if chunk.finish_reason:
            if chunk.finish_reason == "cancelled":
                raise Cancelled(
                    f"the generation on {self.record.name} was cancelled before it finished",
                    hint="the model was unloaded or the server is stopping; retry",
                )
            self.finishes[chunk.index] = chunk.finish_reason
            if chunk.index == 0:
                self.finish_reason = chunk.finish_reason

    def call_events(self, limit: int | None = None) -> CallEvents:
        """The stream's tool-call events (:mod:`localrun.server.tool_events`): each call checked against
        the request's tools when it ends, and held until then where the runtime has no grammar."""
        hold = "grammar" not in (self.stream.capabilities or ())
        return CallEvents(tools=self._tools, model=self.record.name, limit=limit, hold=hold)

    async def _race(self, work: Awaitable[T]) -> T:
        """Await ``work`` unless the client disconnects first; then cancel it and raise ClientGone."""
        task = asyncio.ensure_future(work)
        watcher = asyncio.ensure_future(_wait_disconnect(self.request))
        try:
            await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                try:
                    await task  # runs the stream's finally blocks: the worker is told to stop
                except (asyncio.CancelledError, LocalrunError):
                    pass
            watcher.cancel()
        if task.cancelled():
            raise ClientGone(f"the client left before {self.record.name} answered")
        return task.result()

    def pipe(self, transform: Callable[[AsyncGenerator[Chunk, None]], AsyncIterator[Chunk]]) -> None:
        """Put ``transform`` (an async generator over chunks) between the runtime and every reader:
        how the reasoning channel is split off (``server.reasoning``). Before the first read only."""
        self._iter = cast("AsyncGenerator[Chunk, None]", transform(self._iter))  # an async generator's, closable

    async def guarded(self, work: Awaitable[T]) -> T:
        """Await ``work`` (a coroutine that reads this generation) unless the client leaves first."""
        return await self._race(work)

    async def first(self) -> Chunk | None:
        """The first chunk (None if the stream was empty), read before the response starts."""

        async def read() -> Chunk | None:
            try:
                chunk = await self._iter.__anext__()
            except StopAsyncIteration:
                return None
            self._note(chunk)
            return chunk

        try:
            return await self._race(read())
        except BaseException:
            await self.aclose()
            raise

    async def rest(self) -> AsyncGenerator[Chunk, None]:
        """The chunks after the first. Leaving early (or being cancelled) stops the worker."""
        try:
            async for chunk in self._iter:
                self._note(chunk)
                yield chunk
        finally:
            await self.aclose()

    async def collect(self) -> str:
        """The whole answer (the non-streaming response), abandoned if the client leaves."""

        async def fold() -> str:
            parts: dict[int, list[str]] = {0: []}
            async for chunk in self._iter:
                self._note(chunk)
                parts.setdefault(chunk.index, []).append(chunk.text)
                if chunk.logprobs:  # the whole answer's; a stream sends each chunk's own
                    self.choice_logprobs.setdefault(chunk.index, []).extend(chunk.logprobs)
            self.texts = {i: "".join(p) for i, p in sorted(parts.items())}
            return self.texts[0]

        try:
            return await self._race(fold())
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        try:
            await self._iter.aclose()
        finally:
            await self.stream.aclose()


def media_check(found: Sequence[tuple[str, str]]) -> Callable[[ModelRecord, Plan, frozenset[str]], None]:
    """The refusal, in the wire's words (the request's field names), of media a model cannot take:
    what the manager calls before a load that could not serve them (``MediaCheck``)."""
    media = [(field, capability) for field, capability in found if capability in (VISION, AUDIO)]

    def check(record: ModelRecord, plan: Plan, takes: frozenset[str]) -> None:
        refuse_unsupported(media, model=record.name, runtime=plan.runtime, capabilities=takes)

    return check


async def open_generation(
    request: Request,
    model: str,
    req: ChatRequest | CompletionRequest,
    *,
    keep_alive_s: float | None,
    found: list[tuple[str, str]],
    names: ConstraintNames = OPENAI,
) -> Generation:
    """Check the request's schemas and grammars (a 400 here, never a crash in the worker; named
    by the family's ``names``), load and admit (errors become HTTP errors), then refuse fields
    the runtime cannot honour."""
    state = app_state(request)
    await asyncio.to_thread(check_request, req, names)
    stream = await state.manager.aopen(model, req, keep_alive_s=keep_alive_s, check=media_check(found))
    try:
        refuse_unsupported(
            found,
            model=stream.record.name,
            runtime=stream.plan.runtime,
            capabilities=frozenset(stream.capabilities or ()),
        )
    except LocalrunError:
        await stream.aclose()
        raise
    if getattr(req.sampling, "id_slot", -1) >= 0 and "slots" not in (stream.capabilities or ()):
        note_ignored(request, ["id_slot"])  # llama-server's slots are llama.cpp's: others place requests themselves
    return Generation(request, stream, metrics=state.metrics, tools=getattr(req, "tools", ()))


def finish_for_wire(reason: str | None) -> str:
    """OpenAI's finish_reason: "length", "tool_calls", or "stop" for everything else."""
    return reason if reason in ("length", "tool_calls") else "stop"


async def session_call(
    request: Request,
    model: str,
    method: str,
    args: dict[str, Any] | None = None,
    *,
    found: Sequence[tuple[str, str]] = (),
) -> Any:
    """One session extra (``runtimes.base.EXTRAS``) on ``model``, after refusing fields its runtime cannot honour."""
    manager = app_state(request).manager
    lm = await asyncio.to_thread(manager.load, model)
    request_stats(request).model = lm.record.name
    refuse_unsupported(
        list(found), model=lm.record.name, runtime=lm.plan.runtime, capabilities=frozenset(lm.handle.capabilities or ())
    )
    return await asyncio.to_thread(manager.call, lm.record.name, method, args or {})


async def embed_counted(
    request: Request, model: str, inputs: Sequence[str | list[int]], *, found: Sequence[tuple[str, str]] = ()
) -> tuple[list[Any], int]:
    """(vectors, tokens evaluated) for ``inputs`` (texts or token-id lists): the usage both APIs report."""
    if not inputs:
        return [], 0
    out = await session_call(request, model, "embed_usage", {"inputs": list(inputs)}, found=found)
    return out["embeddings"], int(out["prompt_tokens"])


async def prompt_size(request: Request, model: str, req: ChatRequest) -> int:
    """How many tokens the chat request ``req`` renders to, counted by the runtime (render and
    tokenize, no prefill) before its generation starts: Anthropic's ``message_start`` carries it.
    0 where the runtime cannot count; the final usage is the runtime's own either way."""
    try:
        out = await session_call(request, model, "count_prompt", {"request": req.to_dict()})
    except LocalrunError as exc:  # no count_prompt here, or a failure the generation itself will report
        log.debug("%s: no prompt count before the generation: %s", model, exc)
        return 0
    return int(out["prompt_tokens"])
