"""Ollama-compatible generation routes: /api/chat, /api/generate, /api/embed, /api/embeddings.

Ollama's wire format: NDJSON (one JSON object a line), streaming unless ``"stream":
false``, durations in nanoseconds, ``keep_alive`` per request (a duration, seconds, 0 to
unload after the request, negative to keep the model loaded).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localrun.chat import constraints
from localrun.errors import LocalrunError
from localrun.server.errors import InvalidRequest, stream_error_line
from localrun.server.fields import note_ignored, parse_body, refuse_unsupported, strict_fields
from localrun.server.generation import (
    Generation,
    app_state,
    embed_counted,
    finish_for_wire,
    logprobs_asked,
    make_sampling,
    media_check,
    open_generation,
    request_stats,
)
from localrun.server.media_fetch import reader_for
from localrun.server.ollama import answers
from localrun.server.ollama.context import CAPABILITY as CONTEXT_CAPABILITY
from localrun.server.ollama.context import answer_context, with_context
from localrun.server.ollama.convert import core_messages, ollama_tool_calls, with_images
from localrun.server.ollama.errors import OLLAMA
from localrun.server.ollama.schemas import (
    ChatBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    Options,
)
from localrun.server.ollama.show import META_PARAMETERS, META_SYSTEM
from localrun.server.ollama.tags import iso
from localrun.server.openapi import documented
from localrun.server.reasoning import think_reasoning
from localrun.server.schemas import keep_alive_seconds
from localrun.server.streams import stream_tail
from localrun.types import ChatRequest, Chunk, CompletionRequest, Message, Sampling, strip_media_markers

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api")

NDJSON = "application/x-ndjson"

#: The body of /api/chat or /api/generate, kept as the route's own type through its model defaults.
_Body = TypeVar("_Body", ChatBody, GenerateBody)
#: ``context(answer)``: the last line's token ids (/api/generate), None where the runtime cannot tokenize.
_ContextOf = Callable[[str], Awaitable[list[int] | None]]


def _keep_alive(value: float | str | None) -> float | None:
    try:
        return keep_alive_seconds(value)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="keep_alive") from None


def note_options(request: Request, options: Options | None, capabilities: frozenset[str] = frozenset()) -> None:
    """Name the options that will not act (header and log), as Ollama ignores them; an unknown
    key is a 400 only under ``server.strict_fields``."""
    if options is None:
        return
    unknown = options.unknown()
    if unknown and strict_fields(request):
        raise InvalidRequest(
            f"unknown field {unknown[0]!r}",
            param=unknown[0],
            hint="remove it (the server runs with server.strict_fields = true)",
        )
    ignored = options.ignored(capabilities)
    if ignored:
        log.warning(
            "%s: ignoring %s (load-time options, or samplers this runtime does not have)",
            request.url.path[:200],
            ", ".join(ignored),
        )
    if unknown or ignored:
        note_ignored(request, unknown + ignored)


async def _capabilities(
    request: Request, body: ChatBody | GenerateBody, keep_alive_s: float | None, *, needed: bool = False
) -> frozenset[str]:
    """The runtime's capabilities when an option (or ``context``) depends on them: the model is
    loaded, as the request would load it anyway; nothing to ask otherwise, so no extra hop."""
    o = body.options
    if not needed and (o is None or not o.knobs(frozenset(Options.RUNTIME_KNOBS))):
        return frozenset()
    lm = await asyncio.to_thread(app_state(request).manager.load, body.model, keep_alive_s=keep_alive_s)
    return frozenset(lm.handle.capabilities or ())


async def _model_defaults(request: Request, body: _Body) -> tuple[_Body, str | None]:
    """(body, system prompt) with what ``/api/create`` stored for the model: its parameters under
    the request's options (the request's win) and its system prompt, used when the request has none."""
    record = await asyncio.to_thread(app_state(request).manager.resolve, body.model)
    meta = record.metadata or {}
    params, system = meta.get(META_PARAMETERS), meta.get(META_SYSTEM)
    if isinstance(params, dict) and params:
        given = body.options.model_dump(exclude_unset=True) if body.options else {}
        body = body.model_copy(update={"options": Options.model_validate({**params, **given})})
    return body, system if isinstance(system, str) and system else None


def _sampling(request: Request, body: ChatBody | GenerateBody, capabilities: frozenset[str] = frozenset()) -> Sampling:
    cap = app_state(request).settings.runtime.max_tokens_cap
    o = body.options or Options()
    note_options(request, body.options, capabilities)
    seed = o.seed if o.seed is not None and o.seed >= 0 else None  # Ollama: -1 means random
    try:
        schema = body.json_schema()
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="format") from None
    logprobs = logprobs_asked(body.logprobs, body.top_logprobs)
    return make_sampling(
        cap=cap,
        max_tokens=o.num_predict,
        seed=seed,
        stop=o.stop,
        temperature=o.temperature,
        top_p=o.top_p,
        top_k=o.top_k,
        min_p=o.min_p,
        repeat_penalty=o.repeat_penalty,
        json_schema=schema,
        logprobs=logprobs,
        **o.knobs(capabilities),  # only those the runtime has; the rest are named as ignored
    )


async def _load_or_unload(request: Request, model: str, keep_alive_s: float | None, *, chat: bool) -> Response:
    """An empty prompt: Ollama's way to load a model (or, with keep_alive 0, unload it)."""
    manager = app_state(request).manager
    # keep_alive 0 unloads a loaded model by the name it was loaded as, even one removed from the
    # store since (`localrun rm` elsewhere), which no longer resolves.
    if keep_alive_s == 0 and await asyncio.to_thread(manager.unload, model):
        return JSONResponse(_loaded_answer(model, "unload", chat=chat))
    record = await asyncio.to_thread(manager.resolve, model)
    if keep_alive_s == 0:
        await asyncio.to_thread(manager.unload, record.name)
        reason = "unload"
    else:
        await asyncio.to_thread(manager.load, record.name, keep_alive_s=keep_alive_s)
        reason = "load"
    return JSONResponse(_loaded_answer(record.name, reason, chat=chat))


def _loaded_answer(name: str, reason: str, *, chat: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": name, "created_at": iso(), "done": True, "done_reason": reason}
    body.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return body


async def _check_num_ctx(
    request: Request,
    model: str,
    options: Options | None,
    req: ChatRequest | CompletionRequest,
    found: list[tuple[str, str]],
) -> None:
    """Ollama's ``options.num_ctx`` above the loaded context reloads the model with more, as Ollama does
    (once, by tiers, behind in-flight requests: localrun/reload.py), or clamps it to what fits, with the
    reason in the log. Runs before the request is admitted, so the reload never waits on it; media the
    model cannot take are refused before it loads."""
    if options is None or options.num_ctx is None:
        return
    manager = app_state(request).manager
    lm, note = await asyncio.to_thread(
        functools.partial(manager.ensure_context, source="options.num_ctx", media=req.media, check=media_check(found)),
        model,
        options.num_ctx,
    )
    if note:
        logging.getLogger("localrun.activity").warning("%s: %s", lm.name, note)


@documented(ChatBody, answers.OllamaChat, stream=NDJSON)
@router.post("/chat")
async def chat(request: Request) -> Response:
    body: ChatBody = await parse_body(request, ChatBody)
    keep_alive_s = _keep_alive(body.keep_alive)
    if not body.messages:
        return await _load_or_unload(request, body.model, keep_alive_s, chat=True)
    tools = tuple(t.model_dump(exclude_none=True) for t in body.tools or ())
    body, system = await _model_defaults(request, body)
    caps = await _capabilities(request, body, keep_alive_s)
    reader = reader_for(request)
    messages = await asyncio.to_thread(core_messages, body, reader)  # media headers: off the event loop
    if system and not any(m.role == "system" for m in messages):
        messages = (Message("system", system), *messages)
    req = ChatRequest(
        messages=messages,
        sampling=_sampling(request, body, caps),
        tools=tools,
        tool_choice="auto" if tools else None,
    )
    return await _generate(request, body, req, keep_alive_s, chat=True, media_needs=reader.needs())


@documented(GenerateBody, answers.OllamaGenerate, stream=NDJSON)
@router.post("/generate")
async def generate(request: Request) -> Response:
    body: GenerateBody = await parse_body(request, GenerateBody)
    keep_alive_s = _keep_alive(body.keep_alive)
    if not body.prompt and not body.images and not body.unsupported():
        return await _load_or_unload(request, body.model, keep_alive_s, chat=False)
    body, default_system = await _model_defaults(request, body)
    caps = await _capabilities(request, body, keep_alive_s, needed=bool(body.context))
    sampling = _sampling(request, body, caps)
    reader = reader_for(request)
    prompt, media = await asyncio.to_thread(with_images, body.prompt or "", body.images, "images", reader)
    if media and body.context:
        raise InvalidRequest(
            "'context' (token ids) cannot carry images: send the conversation to /api/chat instead",
            param="context",
        )
    req: ChatRequest | CompletionRequest
    if body.raw or body.suffix:  # fill-in-the-middle, like a raw prompt, skips the chat template
        req = CompletionRequest(prompt=prompt, sampling=sampling, suffix=body.suffix or None, media=media)
    else:
        system = strip_media_markers(body.system) if body.system else default_system
        msgs = ([Message("system", system)] if system else []) + [Message("user", prompt, media=media)]
        req = ChatRequest(messages=tuple(msgs), sampling=sampling)
    if body.context:  # the model is loaded (needed=True above): refuse before asking it to tokenize
        lm = await asyncio.to_thread(app_state(request).manager.load, body.model, keep_alive_s=keep_alive_s)
        refuse_unsupported(
            [("context", CONTEXT_CAPABILITY)], model=lm.record.name, runtime=lm.plan.runtime, capabilities=caps
        )
        req = await with_context(request, lm.record.name, req, body.context)
    return await _generate(request, body, req, keep_alive_s, chat=False, media_needs=reader.needs())


async def _generate(
    request: Request,
    body: ChatBody | GenerateBody,
    req: ChatRequest | CompletionRequest,
    keep_alive_s: float | None,
    *,
    chat: bool,
    media_needs: list[tuple[str, str]],
) -> Response:
    started = time.perf_counter()
    found = body.unsupported() + media_needs
    await _check_num_ctx(request, body.model, body.options, req, found)
    gen = await open_generation(
        request, body.model, req, keep_alive_s=keep_alive_s, found=found, names=constraints.OLLAMA
    )
    loaded = time.perf_counter()
    try:
        if isinstance(req, ChatRequest):
            think_reasoning(request, gen, req, body.think)
    except LocalrunError:
        await gen.aclose()
        raise
    timing = (started, loaded)
    if body.stream is False:
        text = await gen.collect()
        line = _final(gen, timing, chat=chat)
        if chat:
            line["message"] = {"role": "assistant", "content": text}
            if gen.reasoning:
                line["message"]["thinking"] = gen.reasoning
            if gen.tool_calls:
                line["message"]["tool_calls"] = ollama_tool_calls(gen.tool_calls)
        else:
            line["response"] = text
            if gen.reasoning:
                line["thinking"] = gen.reasoning
            if not req.media and (context := await answer_context(request, gen, req, text)) is not None:
                line["context"] = context
        if body.logprobs:
            line["logprobs"] = gen.logprobs
        return JSONResponse(line)
    first = await gen.first()
    # A prompt with media has no token-id context: its images are not tokens of the vocabulary.
    tail: _ContextOf | None = None if chat or req.media else (lambda answer: answer_context(request, gen, req, answer))
    return StreamingResponse(_ndjson(gen, first, timing, chat=chat, context=tail), media_type=NDJSON)


def _final(gen: Generation, timing: tuple[float, float], *, chat: bool) -> dict[str, Any]:
    started, loaded = timing
    stats = gen.stats
    end = time.perf_counter()
    first = stats.first_token_at or end
    last = stats.last_token_at or end
    reason = (
        "stop" if gen.finish_reason == "tool_calls" else finish_for_wire(gen.finish_reason)
    )  # Ollama says "stop" after calls
    line: dict[str, Any] = {"model": gen.record.name, "created_at": iso(), "done": True, "done_reason": reason}
    line.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    line.update(
        {
            "total_duration": int((end - started) * 1e9),
            "load_duration": int((loaded - started) * 1e9),
            "prompt_eval_count": gen.usage.prompt_tokens,
            "prompt_eval_duration": int(max(0.0, first - loaded) * 1e9),
            "eval_count": gen.usage.completion_tokens,
            "eval_duration": int(max(0.0, last - first) * 1e9),
        }
    )
    return line


async def _ndjson(
    gen: Generation,
    first: Chunk | None,
    timing: tuple[float, float],
    *,
    chat: bool,
    context: _ContextOf | None = None,
) -> AsyncIterator[bytes]:
    """The stream's lines; ``context(answer)`` gives the last line's token ids (/api/generate)."""
    answer: list[str] = []
    head = json.dumps({"model": gen.record.name})[:-1] + ',"created_at":"'
    if chat:
        mid = '","message":{"role":"assistant","content":'
        tail = b'},"done":false}\n'
    else:
        mid = '","response":'
        tail = b',"done":false}\n'
    dumps = json.dumps
    calls = gen.call_events() if chat else None

    def line(chunk: Chunk) -> bytes | None:
        if context is not None and chunk.text:
            answer.append(chunk.text)
        # Ollama's API sends whole calls: each in a line of its own as soon as it ends.
        events = calls.push(chunk) if calls is not None else []
        ended = [ollama_tool_calls([e.call()], e.index)[0] for e in events if e.kind == "end"]
        if chunk.logprobs or ended or chunk.reasoning:  # rarer and larger: a whole object
            out: dict[str, Any] = {"model": gen.record.name, "created_at": iso()}
            if chat:
                out["message"] = {"role": "assistant", "content": chunk.text}
                if chunk.reasoning:
                    out["message"]["thinking"] = chunk.reasoning
                if ended:
                    out["message"]["tool_calls"] = ended
            else:
                out["response"] = chunk.text
                if chunk.reasoning:
                    out["thinking"] = chunk.reasoning
            if chunk.logprobs:
                out["logprobs"] = list(chunk.logprobs)
            out["done"] = False
            return dumps(out, ensure_ascii=False).encode() + b"\n"
        if not chunk.text:
            return None
        return (head + iso() + mid + dumps(chunk.text, ensure_ascii=False)).encode() + tail

    async def finish() -> AsyncIterator[bytes]:
        last = _final(gen, timing, chat=chat)
        if context is not None and (ids := await context("".join(answer))) is not None:
            last["context"] = ids
        yield json.dumps(last).encode() + b"\n"

    opening = [first] if first is not None else []
    async for out in stream_tail(gen, opening, lambda chunk: (line(chunk),), failed=ndjson_error, finish=finish):
        yield out


def ndjson_error(exc: LocalrunError) -> bytes:
    """The error line of a stream that started: Ollama's ``{"error": …}`` as one NDJSON line."""
    return json.dumps(stream_error_line(exc, OLLAMA)).encode() + b"\n"


@documented(EmbedBody, answers.OllamaEmbed)
@router.post("/embed", response_model=None)
async def embed(request: Request) -> dict[str, Any]:
    body: EmbedBody = await parse_body(request, EmbedBody)
    note_options(request, body.options)
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    manager = app_state(request).manager
    started = time.perf_counter()
    record = await asyncio.to_thread(manager.resolve, body.model)
    request_stats(request).model = record.name
    keep_alive_s = _keep_alive(body.keep_alive)
    if keep_alive_s is not None:
        await asyncio.to_thread(manager.load, record.name, keep_alive_s=keep_alive_s)
    vectors, n_tokens = await embed_counted(request, record.name, texts)
    if body.dimensions is not None:
        vectors = [truncated(v, body.dimensions) for v in vectors]
    return {
        "model": record.name,
        "embeddings": vectors,
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": n_tokens,
    }


def truncated(vector: list[float], dimensions: int) -> list[float]:
    """The first ``dimensions`` values, normalized to unit length again, as Ollama's /api/embed does
    (Matryoshka-trained models keep their meaning in the leading dimensions); a vector no longer
    than ``dimensions`` is left as it is, as there."""
    if dimensions >= len(vector):
        return vector
    head = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in head))
    return [x / max(norm, 1e-12) for x in head]


@documented(EmbeddingsBody, answers.OllamaEmbedding)
@router.post("/embeddings", response_model=None)
async def embeddings(request: Request) -> dict[str, Any]:
    body: EmbeddingsBody = await parse_body(request, EmbeddingsBody)
    note_options(request, body.options)
    manager = app_state(request).manager
    record = await asyncio.to_thread(manager.resolve, body.model)
    request_stats(request).model = record.name
    keep_alive_s = _keep_alive(body.keep_alive)
    if keep_alive_s is not None:
        await asyncio.to_thread(manager.load, record.name, keep_alive_s=keep_alive_s)
    if not body.prompt:
        return {"embedding": []}
    vectors, _ = await embed_counted(request, record.name, [body.prompt])
    return {"embedding": vectors[0] if vectors else []}
