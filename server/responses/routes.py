"""OpenAI's Responses API: ``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``.

The request becomes the core's ChatRequest (see ``responses_convert``) and runs through
the same ``open_generation`` as chat completions: one chunk stream, the capability rule
(a field the runtime cannot honour is a 400 naming it), the client watched while the
answer is made and a disconnect stopping the worker. The answer is built by
``responses_output``; ``response_store`` keeps it when ``store`` is not false, so
``previous_response_id`` continues the conversation. Codex's stateless use (the whole
history in ``input``, ``store: false``) needs no storage at all.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, Response, StreamingResponse

from localrun.chat import constraints
from localrun.errors import LocalrunError
from localrun.server.fields import parse_body
from localrun.server.generation import Generation, app_state, logprobs_asked, make_sampling, open_generation
from localrun.server.media_fetch import reader_for, resolve_remote
from localrun.server.openapi import SSE, documented
from localrun.server.reasoning import effort_ask, enable_reasoning
from localrun.server.responses import answers
from localrun.server.responses.convert import ToolSet, conversation, needs, parse_items, tool_choice, tool_set
from localrun.server.responses.output import Draft, EventWriter, new_id, output_items, status_of, usage_object
from localrun.server.responses.schemas import NamedChoice, ResponsesRequest
from localrun.server.responses.store import ResponseStore
from localrun.server.streams import stream_tail
from localrun.types import ChatRequest, Chunk, Sampling

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def response_store(request: Request) -> ResponseStore:
    """The app's store, made on first use (``create_app`` stays unaware of it)."""
    state = app_state(request)
    store = getattr(state, "response_store", None)
    if store is None:
        store = state.response_store = ResponseStore(state.settings.data_dir / "responses.sqlite3")
    return store


def _raw_input(body: ResponsesRequest) -> list[Any]:
    if body.input is None:
        return []
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    return list(body.input)


def _echo(body: ResponsesRequest, sampling: Sampling, choice: Any) -> dict[str, Any]:
    """The request's settings as every response object repeats them (what actually ran)."""
    fmt = body.text.format if body.text and body.text.format else None
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {
            "effort": body.reasoning.effort if body.reasoning else None,
            "summary": body.reasoning.summary if body.reasoning else None,
        },
        "store": body.store is not False,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
        "tool_choice": choice if choice is not None else "auto",
        "tools": list(body.tools or ()),
        "top_logprobs": body.top_logprobs,
        "truncation": body.truncation or "disabled",
        "user": body.user,
        "background": False,
        "service_tier": body.service_tier or "default",
        "prompt_cache_key": body.prompt_cache_key,
        "safety_identifier": body.safety_identifier,
    }


def _found(body: ResponsesRequest, items: list[tuple[str, Any]], tools: ToolSet, choice: Any) -> list[tuple[str, str]]:
    found = body.unsupported() + needs(items)
    if tools.tools and choice != "none":
        found.append(("tools", "tools"))
    if choice not in (None, "none", "auto"):
        found.append(("tool_choice", "tools"))
    return found


def _sampling(request: Request, body: ResponsesRequest) -> Sampling:
    fmt = body.text.format if body.text else None
    schema = None
    if fmt is not None and fmt.type != "text":
        schema = {} if fmt.type == "json_object" else (fmt.schema_ or {})
    wants_logprobs = body.top_logprobs is not None or "message.output_text.logprobs" in (body.include or ())
    return make_sampling(
        cap=app_state(request).settings.runtime.max_tokens_cap,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        json_schema=schema,
        logprobs=logprobs_asked(wants_logprobs, body.top_logprobs),
    )


def _calls(gen: Generation, body: ResponsesRequest) -> list[dict[str, Any]]:
    calls = list(gen.tool_calls)
    if body.parallel_tool_calls is False:
        calls = calls[:1]
    if body.max_tool_calls is not None:
        calls = calls[: body.max_tool_calls]
    return calls


@documented(ResponsesRequest, answers.ResponseObject, stream=SSE)
@router.post("/responses")
async def create_response(request: Request) -> Response:
    body: ResponsesRequest = await parse_body(request, ResponsesRequest)
    body.check_include()
    store = response_store(request)
    history = await asyncio.to_thread(store.history, body.previous_response_id) if body.previous_response_id else []
    items = parse_items(history, "previous_response_id") + parse_items(body.input)
    tools = tool_set(body)
    choice = tool_choice(body, tools)
    sampling = _sampling(request, body)
    reader = reader_for(request)
    messages = await asyncio.to_thread(conversation, items, body.instructions, reader)  # media headers: off the loop
    messages = await resolve_remote(reader, messages, app_state(request).settings.server)
    req = ChatRequest(
        messages=messages,
        sampling=sampling,
        tools=tuple(tools.tools),
        tool_choice=choice,
        parallel_tool_calls=False if body.max_tool_calls == 1 else body.parallel_tool_calls,
    )
    found = _found(body, items, tools, choice) + reader.needs()
    gen = await open_generation(request, body.model, req, keep_alive_s=None, found=found, names=constraints.RESPONSES)
    try:  # a reasoning model's channel becomes reasoning items, its budget set by reasoning.effort
        enable_reasoning(
            request, gen, req, effort_ask(body.reasoning.effort if body.reasoning else None, "reasoning.effort")
        )
    except LocalrunError:
        await gen.aclose()
        raise
    echo = _echo(
        body,
        sampling,
        body.tool_choice.model_dump(exclude_none=True) if isinstance(body.tool_choice, NamedChoice) else choice,
    )
    draft = Draft(new_id("resp"), gen.record.name, echo)
    keep = store if body.store is not False else None
    encrypted = "reasoning.encrypted_content" in (body.include or ())
    if not body.stream:
        text = await gen.collect()
        status, reason = status_of(gen.finish_reason)
        logprobs = gen.logprobs if sampling.logprobs is not None else None
        output = output_items(text, gen.reasoning, _calls(gen, body), tools, encrypted=encrypted, logprobs=logprobs)
        usage = usage_object(gen.usage, reasoning_tokens=len(gen.reasoning_parts))
        response = draft.envelope(status=status, output=output, usage=usage, incomplete=reason)
        await _keep(keep, draft.rid, body, response)
        return JSONResponse(response)
    first = await gen.first()
    writer = EventWriter(draft, tools, encrypted=encrypted)
    return StreamingResponse(
        _events(gen, first, writer, body, keep), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _keep(store: ResponseStore | None, rid: str, body: ResponsesRequest, response: dict[str, Any]) -> None:
    if store is None:
        return
    try:
        await asyncio.to_thread(store.put, rid, body.previous_response_id, _raw_input(body), response)
    except sqlite3.Error as exc:  # the answer is made; a store that fails must not lose it
        log.warning("could not store response %s in %s: %s", rid, store.path, exc)


async def _events(
    gen: Generation, first: Chunk | None, writer: EventWriter, body: ResponsesRequest, keep: ResponseStore | None
) -> AsyncIterator[bytes]:
    async def finish() -> AsyncIterator[bytes]:
        data, response = writer.finish(gen.finish_reason, gen.usage, reasoning_tokens=len(gen.reasoning_parts))
        await _keep(keep, writer.draft.rid, body, response)  # before the last event: a client may continue at once
        yield data

    yield writer.start()
    opening = [first] if first is not None else []
    limits = [n for n in (1 if body.parallel_tool_calls is False else None, body.max_tool_calls) if n is not None]
    calls = gen.call_events(limit=min(limits) if limits else None)

    def piece(chunk: Chunk) -> tuple[bytes]:
        out = writer.reasoning(chunk.reasoning) if chunk.reasoning else b""
        if chunk.text:
            out += writer.text(chunk.text, chunk.logprobs)
        return (out + writer.calls(calls.push(chunk)),)

    async for out in stream_tail(gen, opening, piece, failed=lambda exc: writer.fail(exc)[0], finish=finish):
        yield out


@documented(answer=answers.ResponseObject)
@router.get("/responses/{rid}", response_model=None)
async def get_response(request: Request, rid: str) -> dict[str, Any]:
    return await asyncio.to_thread(response_store(request).get, rid)


@documented(answer=answers.Deleted)
@router.delete("/responses/{rid}", response_model=None)
async def delete_response(request: Request, rid: str) -> dict[str, Any]:
    from localrun.server.responses.store import ResponseNotFound

    if not await asyncio.to_thread(response_store(request).delete, rid):
        raise ResponseNotFound(f"no stored response with id {rid[:200]!r}")
    return {"id": rid, "object": "response", "deleted": True}


def _bare_router() -> APIRouter:
    """The same routes without ``/v1`` (``POST /responses``…), like OpenAI's other bare aliases: a client
    whose base URL lacks ``/v1`` (llama.cpp's own server tests among them) got a 404 here alone."""
    bare = APIRouter()
    for route in cast("list[APIRoute]", router.routes):  # the routes above, every one an APIRoute
        bare.add_api_route(
            route.path.removeprefix("/v1"),
            route.endpoint,
            methods=list(route.methods or ()),
            include_in_schema=False,
            response_model=None,  # as on the /v1 routes: a return annotation is no response model
        )
    return bare


bare_router = _bare_router()
