"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings.

One chunk stream, OpenAI's wire format: Server-Sent Events ``data: {…}`` ending with
``data: [DONE]``. Each event is formatted from a prebuilt prefix, so a token costs one
``json.dumps`` of its text and one socket write — no thread hop, no flush timer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, cast

from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, Response, StreamingResponse

from localrun.chat import constraints
from localrun.errors import LocalrunError
from localrun.modelstore.capabilities import capabilities
from localrun.server.answers import EmbeddingList
from localrun.server.convert import completion_prompt
from localrun.server.embeddings import EmbeddingRequestBody, embedding_list
from localrun.server.errors import InvalidRequest
from localrun.server.fields import parse_body
from localrun.server.generation import (
    Generation,
    app_state,
    logprobs_asked,
    make_sampling,
    open_generation,
    session_call,
)
from localrun.server.media_fetch import reader_for, resolve_remote
from localrun.server.openai import answers
from localrun.server.openai.choices import (
    answer_head,
    chat_logprobs,
    check_best_of,
    legacy_logprobs,
    many_choices,
    sse_choices,
    usage_dict,
)
from localrun.server.openai.convert import core_messages, core_tools
from localrun.server.openai.events import finish_of, function_call, is_legacy, sse_events, tool_calls
from localrun.server.openai.models import openai_model, openai_upstream_model
from localrun.server.openai.schemas import ChatCompletionRequest, CompletionRequestBody, Sampled
from localrun.server.openapi import SSE, documented
from localrun.server.reasoning import effort_ask, enable_reasoning, reasoning_fields
from localrun.server.validate import refuse_empty_prompt
from localrun.types import ChatRequest, CompletionRequest

if TYPE_CHECKING:
    from localrun.settings import Settings

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@documented(answer=answers.ModelList)
@router.get("/models", response_model=None)
async def list_models(request: Request) -> dict[str, Any]:
    manager = app_state(request).manager
    records = await asyncio.to_thread(manager.store.list)
    loaded = {m["name"]: m for m in manager.loaded()}
    # capabilities read each projector's header (cached) and parse each template: off the loop
    entries = await asyncio.to_thread(manager.catalog, records, with_capabilities=True)
    local = [openai_model(e.record, loaded.get(e.name), list(e.capabilities)) for e in entries if not e.upstreams]
    remote = [openai_upstream_model(e) for e in entries if e.upstreams]
    return {"object": "list", "data": local + remote}


@documented(answer=answers.ModelObject)
@router.get("/models/{model:path}", response_model=None)
async def get_model(request: Request, model: str) -> dict[str, Any]:
    state = app_state(request)
    record = await asyncio.to_thread(state.manager.resolve, model)
    loaded = {m["name"]: m for m in state.manager.loaded()}
    caps = await asyncio.to_thread(capabilities, record, state.settings)
    return openai_model(record, loaded.get(record.name), caps)


def refuse_many_choices(request: Request, n: int, field: str = "n") -> None:
    """A 400 for more choices than ``server.max_choices``: each is a whole generation on the model."""
    most = app_state(request).settings.server.max_choices
    if n > most:
        raise InvalidRequest(
            f"{field!r} asks for {n} choices; this server gives at most {most} per request",
            param=field,
            hint=f"ask for {most} or fewer (or send several requests), or raise server.max_choices",
        )


@documented(ChatCompletionRequest, answers.ChatCompletion, stream=SSE)
@router.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    body: ChatCompletionRequest = await parse_body(request, ChatCompletionRequest)
    cap = app_state(request).settings.runtime.max_tokens_cap
    tools, tool_choice = core_tools(body)
    refuse_many_choices(request, body.n or 1)
    if (body.n or 1) > 1 and tools:
        raise InvalidRequest(
            "'n' above 1 cannot be combined with tools: each answer would need its own calls",
            param="n",
            hint="ask for one choice, or leave the tools out",
        )
    sampling = make_sampling(
        cap=cap,
        max_tokens=body.token_limit(body.max_completion_tokens),
        seed=body.seed,
        stop=body.stop,
        json_schema=_json_schema(body, body.response_format.schema_for_sampling() if body.response_format else None),
        logprobs=logprobs_asked(body.logprobs, body.top_logprobs),
        **body.sampling_knobs(),
    )
    reader = reader_for(request)
    messages = await asyncio.to_thread(core_messages, body, reader)  # media headers: off the event loop
    messages = await resolve_remote(reader, messages, app_state(request).settings.server)
    req = ChatRequest(
        messages=messages,
        sampling=sampling,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls,
        template_kwargs=dict(body.chat_template_kwargs or {}),
        add_generation_prompt=body.add_generation_prompt is not False,
        continue_final_message=bool(body.continue_final_message),
    )
    gen = await open_generation(
        request, body.model, req, keep_alive_s=None, found=body.unsupported() + reader.needs(), names=_names(body)
    )
    try:
        enable_reasoning(request, gen, req, effort_ask(body.reasoning_effort, "reasoning_effort"))
    except LocalrunError:
        await gen.aclose()
        raise
    return await _respond(request, gen, body, chat=True)


def _names(body: Sampled) -> constraints.ConstraintNames:
    """The schema's path as the client sent it: llama.cpp's top-level ``json_schema`` or ``response_format``."""
    return constraints.LLAMA_SERVER if body.json_schema is not None else constraints.OPENAI


def _json_schema(body: Sampled, from_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """``Sampling.json_schema`` from response_format or llama.cpp's top-level ``json_schema``; both, or
    either with a ``grammar``, is a 400 (they would constrain the answer twice)."""
    if body.json_schema is not None and from_format is not None:
        raise InvalidRequest(
            "'json_schema' and 'response_format' both constrain the answer: send one", param="json_schema"
        )
    schema = body.json_schema if body.json_schema is not None else from_format
    if schema is not None and body.grammar:
        raise InvalidRequest("'grammar' and a JSON schema both constrain the answer: send one", param="grammar")
    return schema


#: OpenAI's documented default of the legacy completions' ``max_tokens``; chat completions have none (the cap).
LEGACY_MAX_TOKENS = 16


def legacy_token_limit(body: CompletionRequestBody) -> int | None:
    """The legacy route's limit: what the client set, llama-server's ``n_predict: -1`` (the cap), else 16.

    Without it a bare ``{"prompt": …}`` ran to the server's cap (8,192 tokens), where every
    OpenAI client expects 16.
    """
    limit = body.token_limit()
    if limit is None and body.n_predict is None:
        return LEGACY_MAX_TOKENS
    return limit


@documented(CompletionRequestBody, answers.TextCompletion, stream=SSE)
@router.post("/completions")
async def completions(request: Request) -> Response:
    body: CompletionRequestBody = await parse_body(request, CompletionRequestBody)
    cap = app_state(request).settings.runtime.max_tokens_cap
    n, best_of = body.n or 1, body.best_of or 1
    refuse_many_choices(request, max(n, best_of), "best_of" if best_of > n else "n")
    check_best_of(body, n, best_of)
    knobs = body.sampling_knobs()
    knobs["n"] = max(n, best_of)
    # best_of ranks candidates by their tokens' mean log-probability: gathered even when not asked.
    logprobs = body.logprobs if body.logprobs is not None else (0 if best_of > 1 else None)
    sampling = make_sampling(
        cap=cap,
        max_tokens=legacy_token_limit(body),
        seed=body.seed,
        stop=body.stop,
        json_schema=_json_schema(body, None),
        logprobs=logprobs,
        **knobs,
    )
    ids = body.prompt_ids()
    reader = reader_for(request)
    prompt, media = await asyncio.to_thread(completion_prompt, body.prompt_text(), body.multimodal_prompt(), reader)
    refuse_empty_prompt(prompt, ids, suffix=body.suffix)
    req = CompletionRequest(
        prompt=prompt, sampling=sampling, prompt_tokens=tuple(ids or ()), suffix=body.suffix, media=media
    )
    gen = await open_generation(
        request, body.model, req, keep_alive_s=None, found=body.unsupported() + reader.needs(), names=_names(body)
    )
    echo = None
    if body.echo:
        echo = (
            body.prompt_text()
            if ids is None
            else (await session_call(request, gen.record.name, "detokenize", {"tokens": ids}))["content"]
        )
    return await _respond(request, gen, body, chat=False, echo=echo)


async def _respond(
    request: Request,
    gen: Generation,
    body: ChatCompletionRequest | CompletionRequestBody,
    *,
    chat: bool,
    echo: str | None = None,
) -> Response:
    head = answer_head(gen, body, chat=chat)
    asked_logprobs = head.asked_logprobs
    if not body.stream:
        text = await gen.collect()
        if len(gen.texts) > 1 or (body.n or 1) > 1:
            choices = many_choices(gen, body, chat=chat, asked_logprobs=asked_logprobs, echo=echo)
        elif chat:
            chat_body = cast(ChatCompletionRequest, body)  # chat: the chat route's body
            choices = [_chat_choice(gen, chat_body, text, asked_logprobs, app_state(request).settings)]
        else:
            legacy_body = cast(CompletionRequestBody, body)  # not chat: the completions route's body
            lp = (
                legacy_logprobs(gen.logprobs, len(echo) if echo is not None else len(legacy_body.prompt_text()))
                if asked_logprobs
                else None
            )
            choices = [
                {"index": 0, "text": (echo or "") + text, "logprobs": lp, "finish_reason": finish_of(gen, False)}
            ]
        return JSONResponse({**head.base(gen, chunk=False), "choices": choices, "usage": usage_dict(gen.usage)})
    first = await gen.first()
    if (body.n or 1) > 1:
        events = sse_choices(gen, first, body, head, echo=echo)
    else:
        events = sse_events(gen, first, body, head, echo=echo, settings=app_state(request).settings)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


def _chat_choice(
    gen: Generation, body: ChatCompletionRequest, text: str, asked_logprobs: bool, settings: Settings
) -> dict[str, Any]:
    legacy = is_legacy(body, True)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if legacy:
        call = function_call(gen)
        if call:
            message = {"role": "assistant", "content": text or None, "function_call": call}
    elif calls := tool_calls(gen, body):
        message = {"role": "assistant", "content": text or None, "tool_calls": calls}
    message.update(reasoning_fields(gen.reasoning, settings))
    lp = chat_logprobs(gen.logprobs) if asked_logprobs else None
    return {"index": 0, "message": message, "logprobs": lp, "finish_reason": finish_of(gen, legacy)}


@documented(EmbeddingRequestBody, EmbeddingList)
@router.post("/embeddings")
async def embeddings(request: Request) -> dict[str, Any]:
    body: EmbeddingRequestBody = await parse_body(request, EmbeddingRequestBody)
    return await embedding_list(request, body)


def _bare_router() -> APIRouter:
    """The same routes without ``/v1``, for clients configured with a base URL that lacks it.
    ``/embeddings`` is not among them: llama_routes answers it (OpenAI's shape for ``input``)."""
    bare = APIRouter()
    for route in cast("list[APIRoute]", router.routes):  # the routes above, every one an APIRoute
        path = route.path.removeprefix("/v1")
        if path != "/embeddings":
            bare.add_api_route(
                path,
                route.endpoint,
                methods=list(route.methods or ()),
                include_in_schema=False,
                response_model=route.response_model,  # as the route above (None: encoded as returned)
            )
    return bare


bare_router = _bare_router()
