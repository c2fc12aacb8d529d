"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings.

One chunk stream, OpenAI's wire format: Server-Sent Events ``data: {…}`` ending with
``data: [DONE]``. Each event is formatted from a prebuilt prefix, so a token costs one
``json.dumps`` of its text and one socket write — no thread hop, no flush timer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localrun.errors import LocalrunError, UnsupportedFeature
from localrun.server.errors import stream_error_line
from localrun.server.generation import Generation, app_state, finish_for_wire, make_sampling, open_generation, parse_body, request_stats
from localrun.server.model_info import openai_model
from localrun.server.schemas_openai import ChatCompletionRequest, CompletionRequestBody, EmbeddingRequestBody
from localrun.types import ChatRequest, CompletionRequest, Message, Usage

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_ROLES = {"developer": "system"}


def usage_dict(u: Usage) -> dict:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def _message_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text or "" for part in content)


@router.get("/models")
async def list_models(request: Request):
    manager = app_state(request).manager
    records = await asyncio.to_thread(manager.store.list)
    loaded = {m["name"]: m for m in manager.loaded()}
    return {"object": "list", "data": [openai_model(r, loaded.get(r.name)) for r in records]}


@router.get("/models/{model:path}")
async def get_model(request: Request, model: str):
    manager = app_state(request).manager
    record = await asyncio.to_thread(manager.resolve, model)
    loaded = {m["name"]: m for m in manager.loaded()}
    return openai_model(record, loaded.get(record.name))


@router.post("/chat/completions")
async def chat_completions(request: Request):
    body: ChatCompletionRequest = await parse_body(request, ChatCompletionRequest)
    cap = app_state(request).settings.runtime.max_tokens_cap
    sampling = make_sampling(
        cap=cap, max_tokens=body.max_completion_tokens or body.max_tokens, seed=body.seed, stop=body.stop,
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p, repeat_penalty=body.repeat_penalty,
    )
    messages = tuple(Message(_ROLES.get(m.role, m.role), _message_text(m.content)) for m in body.messages)
    req = ChatRequest(messages=messages, sampling=sampling)
    gen = await open_generation(request, body.model, req, keep_alive_s=None, found=body.unsupported())
    return await _respond(request, gen, body, chat=True)


@router.post("/completions")
async def completions(request: Request):
    body: CompletionRequestBody = await parse_body(request, CompletionRequestBody)
    cap = app_state(request).settings.runtime.max_tokens_cap
    sampling = make_sampling(
        cap=cap, max_tokens=body.max_tokens, seed=body.seed, stop=body.stop,
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p, repeat_penalty=body.repeat_penalty,
    )
    found = body.unsupported()
    prompt = body.prompt_text() if not found else ""
    gen = await open_generation(request, body.model, CompletionRequest(prompt=prompt, sampling=sampling), keep_alive_s=None, found=found)
    return await _respond(request, gen, body, chat=False)


async def _respond(request: Request, gen: Generation, body, *, chat: bool) -> Response:
    ident = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
    created = int(time.time())
    if not body.stream:
        text = await gen.collect()
        finish = finish_for_wire(gen.finish_reason)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return JSONResponse({
            "id": ident, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": gen.record.name, "choices": [choice], "usage": usage_dict(gen.usage),
        })
    first = await gen.first()
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = _sse_events(gen, first, ident=ident, created=created, chat=chat, include_usage=include_usage)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


async def _sse_events(gen: Generation, first, *, ident: str, created: int, chat: bool, include_usage: bool) -> AsyncIterator[bytes]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    head = "data: " + json.dumps({"id": ident, "object": kind, "created": created, "model": gen.record.name})[:-1]
    if chat:
        opening = (head + ',"choices":[{"index":0,"delta":{"role":"assistant","content":').encode()
        before = (head + ',"choices":[{"index":0,"delta":{"content":').encode()
        after = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        closing = head + ',"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":'
    else:
        before = opening = (head + ',"choices":[{"index":0,"text":').encode()
        after = b',"logprobs":null,"finish_reason":null}]}\n\n'
        closing = head + ',"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":'
    dumps = json.dumps
    try:
        yield opening + dumps(first.text if first is not None else "", ensure_ascii=False).encode() + after
        async for chunk in gen.rest():
            if chunk.text:
                yield before + dumps(chunk.text, ensure_ascii=False).encode() + after
    except LocalrunError as exc:  # started already: the error travels in the stream
        log.warning("stream of %s ended with an error: %s", gen.record.name, exc)
        yield b"data: " + json.dumps(stream_error_line(exc, ollama=False)).encode() + b"\n\n"
        return
    yield (closing + dumps(finish_for_wire(gen.finish_reason)) + "}]}\n\n").encode()
    if include_usage:
        yield (head + ',"choices":[],"usage":' + dumps(usage_dict(gen.usage)) + "}\n\n").encode()
    yield b"data: [DONE]\n\n"


@router.post("/embeddings")
async def embeddings(request: Request):
    body: EmbeddingRequestBody = await parse_body(request, EmbeddingRequestBody)
    texts = body.texts()
    if texts is None:
        raise UnsupportedFeature("'input' as token ids is not supported", hint="send the input as text", param="input")
    manager = app_state(request).manager
    stats = request_stats(request)
    vectors = await asyncio.to_thread(manager.embed, body.model, texts)
    record = await asyncio.to_thread(manager.resolve, body.model)
    stats.model = record.name
    if body.dimensions is not None and vectors and body.dimensions != len(vectors[0]):
        raise UnsupportedFeature(
            f"'dimensions' {body.dimensions} differs from the model's {len(vectors[0])}: truncating embeddings is not supported",
            hint="leave 'dimensions' out", param="dimensions",
        )
    data = []
    for i, vec in enumerate(vectors):
        if body.encoding_format == "base64":
            import numpy as np

            value = base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
        else:
            value = vec
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": record.name, "usage": {"prompt_tokens": 0, "total_tokens": 0}}
