"""Ollama-compatible generation routes: /api/chat, /api/generate, /api/embed, /api/embeddings.

Ollama's wire format: NDJSON (one JSON object a line), streaming unless ``"stream":
false``, durations in nanoseconds, ``keep_alive`` per request (a duration, seconds, 0 to
unload after the request, negative to keep the model loaded).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localrun.errors import LocalrunError, UnsupportedFeature
from localrun.server import answers
from localrun.server.errors import InvalidRequest, stream_error_line
from localrun.server.fields import parse_body
from localrun.server.generation import (
    Generation,
    app_state,
    embed_counted,
    finish_for_wire,
    logprobs_asked,
    make_sampling,
    open_generation,
    request_stats,
)
from localrun.server.model_info import iso
from localrun.server.ollama.convert import core_messages, ollama_tool_calls
from localrun.server.ollama.schemas import (
    ChatBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    Options,
    keep_alive_seconds,
)
from localrun.server.openapi import documented
from localrun.server.reasoning import think_reasoning
from localrun.types import ChatRequest, CompletionRequest, Message

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api")

NDJSON = "application/x-ndjson"


def _keep_alive(value) -> float | None:
    try:
        return keep_alive_seconds(value)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="keep_alive") from None


def _sampling(request: Request, body):
    cap = app_state(request).settings.runtime.max_tokens_cap
    o = body.options or Options()
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
        # Checked against the runtime's capabilities (Options.unsupported) before they get here.
        typical_p=o.typical_p,
        presence_penalty=o.presence_penalty,
        frequency_penalty=o.frequency_penalty,
    )


async def _load_or_unload(request: Request, model: str, keep_alive_s: float | None, *, chat: bool) -> Response:
    """An empty prompt: Ollama's way to load a model (or, with keep_alive 0, unload it)."""
    manager = app_state(request).manager
    record = await asyncio.to_thread(manager.resolve, model)
    if keep_alive_s == 0:
        await asyncio.to_thread(manager.unload, record.name)
        reason = "unload"
    else:
        await asyncio.to_thread(manager.load, record.name, keep_alive_s=keep_alive_s)
        reason = "load"
    body = {"model": record.name, "created_at": iso(), "done": True, "done_reason": reason}
    body.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return JSONResponse(body)


def _check_num_ctx(gen: Generation, options: Options | None) -> None:
    if options is not None and options.num_ctx is not None and options.num_ctx > gen.plan.n_ctx:
        raise UnsupportedFeature(
            f"options.num_ctx {options.num_ctx} is larger than the context {gen.record.name} is loaded with "
            f"({gen.plan.n_ctx})",
            hint="load the model with a larger context (runtime.context_length, or `localrun serve` with --ctx)",
            param="options.num_ctx",
        )


@documented(ChatBody, answers.OllamaChat, stream=NDJSON)
@router.post("/chat")
async def chat(request: Request):
    body: ChatBody = await parse_body(request, ChatBody)
    keep_alive_s = _keep_alive(body.keep_alive)
    if not body.messages:
        return await _load_or_unload(request, body.model, keep_alive_s, chat=True)
    tools = tuple(t.model_dump(exclude_none=True) for t in body.tools or ())
    req = ChatRequest(
        messages=core_messages(body),
        sampling=_sampling(request, body),
        tools=tools,
        tool_choice="auto" if tools else None,
    )
    return await _generate(request, body, req, keep_alive_s, chat=True)


@documented(GenerateBody, answers.OllamaGenerate, stream=NDJSON)
@router.post("/generate")
async def generate(request: Request):
    body: GenerateBody = await parse_body(request, GenerateBody)
    keep_alive_s = _keep_alive(body.keep_alive)
    if not body.prompt and not body.unsupported():
        return await _load_or_unload(request, body.model, keep_alive_s, chat=False)
    sampling = _sampling(request, body)
    if body.raw:
        req = CompletionRequest(prompt=body.prompt or "", sampling=sampling)
    else:
        msgs = ([Message("system", body.system)] if body.system else []) + [Message("user", body.prompt or "")]
        req = ChatRequest(messages=tuple(msgs), sampling=sampling)
    return await _generate(request, body, req, keep_alive_s, chat=False)


async def _generate(request: Request, body, req, keep_alive_s: float | None, *, chat: bool) -> Response:
    started = time.perf_counter()
    gen = await open_generation(request, body.model, req, keep_alive_s=keep_alive_s, found=body.unsupported())
    loaded = time.perf_counter()
    try:
        _check_num_ctx(gen, body.options)
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
        if body.logprobs:
            line["logprobs"] = gen.logprobs
        return JSONResponse(line)
    first = await gen.first()
    return StreamingResponse(_ndjson(gen, first, timing, chat=chat), media_type=NDJSON)


def _final(gen: Generation, timing: tuple[float, float], *, chat: bool) -> dict:
    started, loaded = timing
    stats = gen.stats
    end = time.perf_counter()
    first = stats.first_token_at or end
    last = stats.last_token_at or end
    reason = (
        "stop" if gen.finish_reason == "tool_calls" else finish_for_wire(gen.finish_reason)
    )  # Ollama says "stop" after calls
    line = {"model": gen.record.name, "created_at": iso(), "done": True, "done_reason": reason}
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


async def _ndjson(gen: Generation, first, timing, *, chat: bool) -> AsyncIterator[bytes]:
    head = json.dumps({"model": gen.record.name})[:-1] + ',"created_at":"'
    if chat:
        mid = '","message":{"role":"assistant","content":'
        tail = b'},"done":false}\n'
    else:
        mid = '","response":'
        tail = b',"done":false}\n'
    dumps = json.dumps

    def line(chunk) -> bytes | None:
        if chunk.logprobs or chunk.tool_calls or chunk.reasoning:  # rarer and larger: a whole object
            out: dict = {"model": gen.record.name, "created_at": iso()}
            if chat:
                out["message"] = {"role": "assistant", "content": chunk.text}
                if chunk.reasoning:
                    out["message"]["thinking"] = chunk.reasoning
                if chunk.tool_calls:
                    out["message"]["tool_calls"] = ollama_tool_calls(chunk.tool_calls)
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

    try:
        if first is not None and (out := line(first)):
            yield out
        async for chunk in gen.rest():
            if out := line(chunk):
                yield out
    except LocalrunError as exc:
        log.warning("stream of %s ended with an error: %s", gen.record.name, exc)
        yield json.dumps(stream_error_line(exc, ollama=True)).encode() + b"\n"
        return
    yield json.dumps(_final(gen, timing, chat=chat)).encode() + b"\n"


@documented(EmbedBody, answers.OllamaEmbed)
@router.post("/embed")
async def embed(request: Request):
    body: EmbedBody = await parse_body(request, EmbedBody)
    found = body.options.unsupported() if body.options else []
    if found:
        raise UnsupportedFeature(f"{found[0][0]!r} is not supported for embeddings", param=found[0][0])
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    manager = app_state(request).manager
    started = time.perf_counter()
    record = await asyncio.to_thread(manager.resolve, body.model)
    request_stats(request).model = record.name
    keep_alive_s = _keep_alive(body.keep_alive)
    if keep_alive_s is not None:
        await asyncio.to_thread(manager.load, record.name, keep_alive_s=keep_alive_s)
    vectors, n_tokens = await embed_counted(request, record.name, texts)
    if body.dimensions is not None and vectors and body.dimensions != len(vectors[0]):
        raise UnsupportedFeature(
            f"'dimensions' {body.dimensions} differs from the model's {len(vectors[0])}",
            hint="leave 'dimensions' out",
            param="dimensions",
        )
    return {
        "model": record.name,
        "embeddings": vectors,
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": n_tokens,
    }


@documented(EmbeddingsBody, answers.OllamaEmbedding)
@router.post("/embeddings")
async def embeddings(request: Request):
    body: EmbeddingsBody = await parse_body(request, EmbeddingsBody)
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
