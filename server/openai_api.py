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
from localrun.server.errors import InvalidRequest, stream_error_line
from localrun.server.generation import (
    Generation, app_state, finish_for_wire, logprobs_asked, make_sampling, open_generation, parse_body, request_stats,
)
from localrun.server.model_info import openai_model
from localrun.server.schemas_openai import ChatCompletionRequest, CompletionRequestBody, EmbeddingRequestBody
from localrun.types import ChatRequest, Chunk, CompletionRequest, Message, Usage

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_ROLES = {"developer": "system"}


def usage_dict(u: Usage) -> dict:
    out = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }
    if u.drafted_tokens:
        # Speculative decoding: OpenAI's predicted-output fields say what was kept and what
        # was rejected; the "speculative" extension gives the plain counts.
        out["completion_tokens_details"] = {"accepted_prediction_tokens": u.accepted_tokens,
                                            "rejected_prediction_tokens": u.drafted_tokens - u.accepted_tokens}
        out["speculative"] = {"drafted_tokens": u.drafted_tokens, "accepted_tokens": u.accepted_tokens}
    return out


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


def _messages(body: ChatCompletionRequest) -> tuple[Message, ...]:
    """Core messages; a tool result without a ``name`` gets the one its call had, which some templates show.

    Legacy turns become tool turns: an assistant ``function_call`` is a ``tool_calls`` turn with
    one call whose id is ``call_<message index>`` (stable, so a repeated history renders the same
    prompt), and a ``role: "function"`` result is a ``tool`` turn answering the most recent
    unanswered call of its name (``tool_call_id`` None when there is none).
    """
    called: dict[str, str] = {}
    pending: list[tuple[str, str]] = []  # (id, name) of calls not answered yet, oldest first
    out = []
    for i, m in enumerate(body.messages):
        calls = tuple({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                      for c in m.tool_calls or ())
        if m.function_call is not None:
            calls = _legacy_history_call(i, m, calls)
        called.update((c["id"], c["function"]["name"]) for c in calls)
        pending.extend((c["id"], c["function"]["name"]) for c in calls)
        role, call_id = _ROLES.get(m.role, m.role), m.tool_call_id
        if m.role == "function":
            if m.name is None:
                raise InvalidRequest(f"messages[{i}] has role 'function' but no 'name': name the function whose result it is",
                                     param=f"messages[{i}].name")
            role = "tool"
            if call_id is None:
                call_id = next((cid for cid, name in reversed(pending) if name == m.name), None)
        if call_id is not None and role == "tool":
            pending = [p for p in pending if p[0] != call_id]
        name = m.name if m.name is not None or role != "tool" else called.get(call_id or "")
        out.append(Message(role, _message_text(m.content), tool_calls=calls, tool_call_id=call_id, name=name))
    return tuple(out)


def _legacy_history_call(i: int, m, calls: tuple[dict, ...]) -> tuple[dict, ...]:
    """The one tool call of an assistant turn that carries a legacy ``function_call``."""
    if m.role != "assistant":
        raise InvalidRequest(f"messages[{i}] has a 'function_call' but role {m.role!r}: only an assistant turn calls functions",
                             param=f"messages[{i}].function_call")
    if calls:
        raise InvalidRequest(f"messages[{i}] has both 'tool_calls' and 'function_call': send one of them",
                             param=f"messages[{i}].function_call")
    fn = m.function_call
    return ({"id": f"call_{i}", "type": "function", "function": {"name": fn.name, "arguments": fn.arguments}},)


def _tool_fields(body: ChatCompletionRequest) -> tuple[tuple[dict, ...], object]:
    """(tools, tool_choice) for ChatRequest; a choice that cannot be met is a 400 before any load."""
    legacy = [f for f in ("functions", "function_call") if getattr(body, f) is not None]
    if legacy:
        return _legacy_tool_fields(body, legacy)
    tools = tuple(t.model_dump(exclude_none=True) for t in body.tools or ())
    choice = body.tool_choice
    if choice is not None and not isinstance(choice, str):
        names = {t["function"]["name"] for t in tools}
        if choice.function.name not in names:
            raise InvalidRequest(f"tool_choice names {choice.function.name!r}, which is not among 'tools'", param="tool_choice")
        choice = choice.model_dump()
    elif choice == "required" and not tools:
        raise InvalidRequest("tool_choice 'required' needs at least one tool in 'tools'", param="tool_choice")
    return tools, choice


def _legacy_tool_fields(body: ChatCompletionRequest, legacy: list[str]) -> tuple[tuple[dict, ...], object]:
    """``functions`` / ``function_call`` as (tools, tool_choice); mixed with ``tools`` / ``tool_choice`` it is a 400."""
    modern = [f for f in ("tools", "tool_choice") if getattr(body, f) is not None]
    if modern:
        raise InvalidRequest(f"{legacy[0]!r} and {modern[0]!r} cannot be combined: send either 'functions' and "
                             "'function_call' (legacy) or 'tools' and 'tool_choice'", param=legacy[0])
    tools = tuple({"type": "function", "function": f.model_dump(exclude_none=True)} for f in body.functions or ())
    choice = body.function_call
    if choice is not None and not isinstance(choice, str):
        if choice.name not in {t["function"]["name"] for t in tools}:
            raise InvalidRequest(f"function_call names {choice.name!r}, which is not among 'functions'", param="function_call")
        choice = {"type": "function", "function": {"name": choice.name}}
    return tools, choice


@router.post("/chat/completions")
async def chat_completions(request: Request):
    body: ChatCompletionRequest = await parse_body(request, ChatCompletionRequest)
    cap = app_state(request).settings.runtime.max_tokens_cap
    tools, tool_choice = _tool_fields(body)
    sampling = make_sampling(
        cap=cap, max_tokens=body.max_completion_tokens or body.max_tokens, seed=body.seed, stop=body.stop,
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p, repeat_penalty=body.repeat_penalty,
        json_schema=body.response_format.schema_for_sampling() if body.response_format else None,
        logprobs=logprobs_asked(body.logprobs, body.top_logprobs),
    )
    req = ChatRequest(messages=_messages(body), sampling=sampling, tools=tools, tool_choice=tool_choice)
    gen = await open_generation(request, body.model, req, keep_alive_s=None, found=body.unsupported())
    return await _respond(request, gen, body, chat=True)


@router.post("/completions")
async def completions(request: Request):
    body: CompletionRequestBody = await parse_body(request, CompletionRequestBody)
    cap = app_state(request).settings.runtime.max_tokens_cap
    sampling = make_sampling(
        cap=cap, max_tokens=body.max_tokens, seed=body.seed, stop=body.stop,
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p, repeat_penalty=body.repeat_penalty,
        logprobs=body.logprobs,
    )
    found = body.unsupported()
    prompt = body.prompt_text() if not found or all(f != "prompt" for f, _ in found) else ""
    gen = await open_generation(request, body.model, CompletionRequest(prompt=prompt, sampling=sampling), keep_alive_s=None, found=found)
    return await _respond(request, gen, body, chat=False)


def _tool_calls(gen: Generation, body) -> list[dict]:
    calls = list(gen.tool_calls)
    if getattr(body, "parallel_tool_calls", None) is False:
        calls = calls[:1]
    return calls


def _legacy(body, chat: bool) -> bool:
    """Whether the answer takes the legacy shape: the request offered ``functions``, not ``tools``."""
    return chat and bool(getattr(body, "functions", None))


def _function_call(gen: Generation) -> dict | None:
    """The legacy ``function_call`` of the answer: its first call, the only one that shape can carry."""
    if not gen.tool_calls:
        return None
    if len(gen.tool_calls) > 1:
        log.info("%s made %d calls but a 'functions' request's answer carries one: kept %r, dropped %s", gen.record.name,
                 len(gen.tool_calls), gen.tool_calls[0]["function"]["name"], [c["function"]["name"] for c in gen.tool_calls[1:]])
    fn = gen.tool_calls[0]["function"]
    return {"name": fn["name"], "arguments": fn["arguments"]}


def _finish(gen: Generation, legacy: bool) -> str:
    finish = finish_for_wire(gen.finish_reason)
    return "function_call" if legacy and finish == "tool_calls" else finish


def chat_logprobs(entries) -> dict:
    return {"content": list(entries), "refusal": None}


def legacy_logprobs(entries, offset: int) -> dict:
    """The completions API's older shape: parallel lists, top alternatives as {token: logprob}."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
        tokens.append(e["token"])
    return {
        "tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{a["token"]: a["logprob"] for a in e.get("top_logprobs", ())} for e in entries],
        "text_offset": offsets,
    }


async def _respond(request: Request, gen: Generation, body, *, chat: bool) -> Response:
    ident = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
    created = int(time.time())
    asked_logprobs = bool(body.logprobs) if chat else body.logprobs is not None
    if not body.stream:
        text = await gen.collect()
        legacy = _legacy(body, chat)
        finish = _finish(gen, legacy)
        if chat:
            message: dict = {"role": "assistant", "content": text}
            if legacy:
                call = _function_call(gen)
                if call:
                    message = {"role": "assistant", "content": text or None, "function_call": call}
            elif calls := _tool_calls(gen, body):
                message = {"role": "assistant", "content": text or None, "tool_calls": calls}
            lp = chat_logprobs(gen.logprobs) if asked_logprobs else None
            choice = {"index": 0, "message": message, "logprobs": lp, "finish_reason": finish}
        else:
            lp = legacy_logprobs(gen.logprobs, len(body.prompt_text())) if asked_logprobs else None
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}
        return JSONResponse({
            "id": ident, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": gen.record.name, "choices": [choice], "usage": usage_dict(gen.usage),
        })
    first = await gen.first()
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = _sse_events(gen, first, body, ident=ident, created=created, chat=chat, include_usage=include_usage)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


async def _sse_events(gen: Generation, first, body, *, ident: str, created: int, chat: bool, include_usage: bool) -> AsyncIterator[bytes]:
    """Plain text chunks take the prebuilt-prefix fast path; chunks with log-probabilities
    or tool calls are built as whole objects (they are rarer, and larger anyway)."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": ident, "object": kind, "created": created, "model": gen.record.name}
    head = "data: " + json.dumps(base)[:-1]
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
    legacy = _legacy(body, chat)
    offset = [0 if chat else len(body.prompt_text())]  # text_offset of the completions API's logprobs

    def full(chunk, *, role: bool) -> bytes:
        """One event for a chunk that carries more than text."""
        if chat:
            delta: dict = {"role": "assistant"} if role else {}
            if chunk.text or not chunk.tool_calls:
                delta["content"] = chunk.text
            if chunk.tool_calls and legacy:
                delta["function_call"] = _function_call(gen)  # name and the whole arguments string in one delta
            elif chunk.tool_calls:
                calls = _tool_calls(gen, body)
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
            choice = {"index": 0, "delta": delta, "logprobs": chat_logprobs(chunk.logprobs) if chunk.logprobs else None}
        else:
            lp = legacy_logprobs(chunk.logprobs, offset[0])
            offset[0] += len(chunk.text)
            choice = {"index": 0, "text": chunk.text, "logprobs": lp}
        choice["finish_reason"] = None
        return b"data: " + dumps({**base, "choices": [choice]}, ensure_ascii=False).encode() + b"\n\n"

    def event(chunk, *, role: bool) -> bytes | None:
        if chunk.logprobs or chunk.tool_calls:
            return full(chunk, role=role)
        if not chunk.text and not role:
            return None
        if not chat:
            offset[0] += len(chunk.text)
        return (opening if role else before) + dumps(chunk.text, ensure_ascii=False).encode() + after

    try:
        yield event(first if first is not None else Chunk(), role=True) or b""
        async for chunk in gen.rest():
            line = event(chunk, role=False)
            if line:
                yield line
    except LocalrunError as exc:  # started already: the error travels in the stream
        log.warning("stream of %s ended with an error: %s", gen.record.name, exc)
        yield b"data: " + json.dumps(stream_error_line(exc, ollama=False)).encode() + b"\n\n"
        return
    yield (closing + dumps(_finish(gen, legacy)) + "}]}\n\n").encode()
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
