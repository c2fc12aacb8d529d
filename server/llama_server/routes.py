"""llama-server's own routes, in its request and response shapes (``tools/server/README.md``
of ggml-org/llama.cpp), for the editors, UIs and RAG pipelines written against it:

* ``/tokenize`` (``add_special``, ``with_pieces``), ``/detokenize``, ``/apply-template``;
* ``/completion`` (the native completion: ``content``, ``tokens_predicted``,
  ``tokens_evaluated``, ``stop_type``, ``timings``, ``completion_probabilities``) and
  ``/infill`` (fill-in-the-middle through the model's FIM tokens), both streaming as
  llama-server does (``data: {…}`` events, the last with ``"stop": true``);
* ``/rerank`` and ``/v1/rerank`` (rank-pooled models; results by relevance);
* ``/props`` (read-only facts; the model's path only when the server is bound to loopback);
* ``/embeddings`` given llama-server's ``content`` (per-token vectors under pooling none).
  Given OpenAI's ``input`` it is the OpenAI route (clients configured without ``/v1``).

llama-server serves one model, so ``model`` is optional here (:func:`pick_model`). The
work runs through the same manager, admission and capability checks as the OpenAI routes.

Where localrun differs: ``stop_type`` is ``limit`` or ``eos`` — a stop string is reported as
``eos`` too, since the runtime's finish reason does not tell them apart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localrun import __version__
from localrun.chat import constraints
from localrun.errors import LocalrunError
from localrun.server.convert import completion_prompt, message_content
from localrun.server.embeddings import parse_and_embed
from localrun.server.errors import InvalidRequest, stream_error_line
from localrun.server.fields import parse_body
from localrun.server.generation import (
    Generation,
    app_state,
    logprobs_asked,
    make_sampling,
    open_generation,
    request_stats,
    session_call,
)
from localrun.server.llama_server import answers
from localrun.server.llama_server.schemas import (
    ApplyTemplateBody,
    DetokenizeBody,
    InfillBody,
    NativeCompletion,
    NativeEmbeddingBody,
    NativeSampling,
    RerankBody,
    TokenizeBody,
)
from localrun.server.media_fetch import reader_for
from localrun.server.openapi import SSE, documented
from localrun.server.schemas import MultimodalPrompt
from localrun.server.security import is_loopback_host
from localrun.server.streams import stream_tail
from localrun.server.validate import refuse_empty_prompt
from localrun.types import AUDIO, MEDIA_MARKER, VISION, Chunk, CompletionRequest, Sampling

log = logging.getLogger(__name__)

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def pick_model(request: Request, name: str | None) -> str:
    """The model a route without ``model`` means: the one loaded, else the store's only one,
    else the default model; several candidates are a 400 asking for ``model``."""
    if name:
        return name
    manager = app_state(request).manager
    loaded: list[str] = [m["name"] for m in manager.loaded()]
    if len(loaded) == 1:
        return loaded[0]
    records = await asyncio.to_thread(manager.store.list)
    names: list[str] = [r.name for r in records]
    if len(names) == 1:
        return names[0]
    from localrun.modelstore.builtins import DEFAULT_MODEL_NAME

    if not loaded and DEFAULT_MODEL_NAME in names:
        return DEFAULT_MODEL_NAME
    choices = loaded or names
    raise InvalidRequest(
        "this server has several models: name one with 'model'",
        param="model",
        hint="one of: " + ", ".join(choices[:20]) if choices else "pull or import a model first",
    )


@documented(TokenizeBody, answers.Tokens)
@router.post("/tokenize", response_model=None)
async def tokenize(request: Request) -> dict[str, Any]:
    body: TokenizeBody = await parse_body(request, TokenizeBody)
    model = await pick_model(request, body.model)
    out: dict[str, Any] = await session_call(
        request,
        model,
        "tokenize",
        {"content": body.content, "add_special": body.add_special, "with_pieces": body.with_pieces},
        found=[("content", "token_prompts")],
    )
    return out


@documented(DetokenizeBody, answers.Detokenized)
@router.post("/detokenize", response_model=None)
async def detokenize(request: Request) -> dict[str, Any]:
    body: DetokenizeBody = await parse_body(request, DetokenizeBody)
    model = await pick_model(request, body.model)
    out: dict[str, Any] = await session_call(
        request, model, "detokenize", {"tokens": body.tokens}, found=[("tokens", "token_prompts")]
    )
    return out


@documented(ApplyTemplateBody, answers.Templated)
@router.post("/apply-template", response_model=None)
async def apply_template(request: Request) -> dict[str, Any]:
    body: ApplyTemplateBody = await parse_body(request, ApplyTemplateBody)
    model = await pick_model(request, body.model)
    # Each image or audio part becomes the media marker where it stood, as llama-server's prompt
    # shows it; the media are read (a corrupt one is the same 400 chat gives) but not encoded.
    reader = reader_for(request)

    def templated() -> list[dict[str, Any]]:  # media headers are read off the event loop
        return [
            {"role": m.role, "content": message_content(m.content, f"messages[{i}]", reader)[0]}
            for i, m in enumerate(body.messages)
        ]

    messages = await asyncio.to_thread(templated)
    found = [("chat_template_kwargs", "chat_template_kwargs")] if body.chat_template_kwargs else []
    found += reader.needs()  # media to a model that takes none: the same 400 as chat
    out: dict[str, Any] = await session_call(
        request,
        model,
        "apply_template",
        {
            "messages": messages,
            "template_kwargs": body.chat_template_kwargs or {},
            "add_generation_prompt": body.add_generation_prompt,
        },
        found=found,
    )
    return out


@documented(answer=answers.Props)
@router.get("/props", response_model=None)
async def props(request: Request) -> dict[str, Any]:
    state = app_state(request)
    model = await pick_model(request, request.query_params.get("model"))
    facts = await session_call(request, model, "props")
    lm: dict[str, Any] = next((m for m in state.manager.loaded() if m["name"] == model), {})
    out: dict[str, Any] = {
        "default_generation_settings": {
            "n_ctx": facts["n_ctx"],
            "params": {"n_predict": -1, "max_tokens_cap": state.settings.runtime.max_tokens_cap},
        },
        "total_slots": facts["total_slots"],
        "model_alias": model,
        "chat_template": facts["chat_template"],
        "chat_template_source": facts["chat_template_source"],
        "bos_token": facts["bos_token"],
        "eos_token": facts["eos_token"],
        # What the loaded session takes (its projector, as the runtime opened it), as llama-server says it.
        "modalities": {"vision": VISION in facts["capabilities"], "audio": AUDIO in facts["capabilities"]},
        "media_marker": MEDIA_MARKER,
        "fim": facts["fim"],
        "pooling": facts["pooling"],
        "capabilities": facts["capabilities"],
        "runtime": lm.get("runtime", "llama.cpp"),
        "build_info": f"localrun {__version__}",
    }
    if is_loopback_host(state.settings.server.host):
        record = await asyncio.to_thread(state.manager.resolve, model)
        out["model_path"] = record.path  # a local client may open the file; nobody else learns the layout
    return out


def _native_sampling(request: Request, body: NativeSampling) -> Sampling:
    cap = app_state(request).settings.runtime.max_tokens_cap
    limit = body.max_tokens if body.max_tokens is not None else None if body.n_predict in (None, -1) else body.n_predict
    if body.json_schema is not None and body.grammar:
        raise InvalidRequest("'grammar' and 'json_schema' both constrain the answer: send one", param="grammar")
    return make_sampling(
        cap=cap,
        max_tokens=limit,
        seed=body.seed,
        stop=body.stop,
        temperature=body.temperature,
        top_k=body.top_k,
        top_p=body.top_p,
        min_p=body.min_p,
        typical_p=body.typical_p,
        repeat_penalty=body.repeat_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        grammar=body.grammar,
        json_schema=body.json_schema,
        ignore_eos=body.ignore_eos,
        logit_bias=body.bias_pairs(),
        logprobs=logprobs_asked(True, body.n_probs) if body.n_probs else None,
        id_slot=body.id_slot,
    )


@documented(NativeCompletion, answers.CompletionAnswer, stream=SSE)
@router.post("/completion")
async def completion(request: Request) -> Response:
    body: NativeCompletion = await parse_body(request, NativeCompletion)
    model = await pick_model(request, body.model)
    multimodal = body.prompt if isinstance(body.prompt, MultimodalPrompt) else None
    ids = None if isinstance(body.prompt, (str, MultimodalPrompt)) else list(body.prompt)
    reader = reader_for(request)
    text = multimodal.prompt_string if multimodal else body.prompt if isinstance(body.prompt, str) else ""
    prompt, media = await asyncio.to_thread(completion_prompt, text, multimodal, reader)
    refuse_empty_prompt(prompt, ids)
    req = CompletionRequest(
        prompt=prompt, sampling=_native_sampling(request, body), prompt_tokens=tuple(ids or ()), media=media
    )
    found = body.unsupported() + reader.needs() + ([("prompt", "token_prompts")] if ids is not None else [])
    gen = await open_generation(request, model, req, keep_alive_s=None, found=found, names=constraints.LLAMA_SERVER)
    return await _native_answer(gen, body)


@documented(InfillBody, answers.CompletionAnswer, stream=SSE)
@router.post("/infill")
async def infill(request: Request) -> Response:
    """Fill in the middle: ``input_extra`` chunks (other files) come first, then ``input_prefix``;
    ``prompt`` is the start of the middle, which the model continues."""
    body: InfillBody = await parse_body(request, InfillBody)
    model = await pick_model(request, body.model)
    extra = "".join((f"{c.filename}\n" if c.filename else "") + c.text + "\n" for c in body.input_extra)
    req = CompletionRequest(
        prompt=extra + body.input_prefix,
        suffix=body.input_suffix,
        middle=body.prompt,
        sampling=_native_sampling(request, body),
    )
    gen = await open_generation(
        request,
        model,
        req,
        keep_alive_s=None,
        found=[("input_suffix", "fill-in-the-middle"), *body.unsupported()],
        names=constraints.LLAMA_SERVER,
    )
    return await _native_answer(gen, body, lead=body.prompt)


def _timings(gen: Generation, started: float) -> dict[str, Any]:
    stats, usage = gen.stats, gen.usage
    first = stats.first_token_at or time.perf_counter()
    last = stats.last_token_at or first
    prompt_ms, predicted_ms = max(0.0, first - started) * 1e3, max(0.0, last - first) * 1e3
    prompt_n, predicted_n = usage.prompt_tokens - usage.cached_tokens, usage.completion_tokens
    return {
        "cache_n": usage.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_second": round(prompt_n / (prompt_ms / 1e3), 3) if prompt_ms > 0 else None,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_second": round((predicted_n - 1) / (predicted_ms / 1e3), 3)
        if predicted_ms > 0 and predicted_n > 1
        else None,
    }


def _final(
    gen: Generation, body: NativeSampling, started: float, content: str, probs: list[dict[str, Any]]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "content": content,
        "model": gen.record.name,
        "stop": True,
        "tokens_predicted": gen.usage.completion_tokens,
        "tokens_evaluated": gen.usage.prompt_tokens,
        "tokens_cached": gen.usage.cached_tokens,
        "truncated": False,
        "stop_type": "limit" if gen.finish_reason == "length" else "eos",
        "stopping_word": "",
        "timings": _timings(gen, started),
    }
    if body.n_probs:
        out["completion_probabilities"] = probs
    return out


async def _native_answer(gen: Generation, body: NativeSampling, *, lead: str = "") -> Response:
    started = time.perf_counter()
    if not body.stream:
        text = await gen.collect()
        return JSONResponse(_final(gen, body, started, lead + text, list(gen.logprobs)))
    first = await gen.first()
    return StreamingResponse(
        _native_events(gen, first, body, started, lead), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _native_events(
    gen: Generation, first: Chunk | None, body: NativeSampling, started: float, lead: str
) -> AsyncIterator[bytes]:
    def event(obj: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"

    def piece(chunk: Chunk) -> bytes | None:
        if not chunk.text and not chunk.logprobs:
            return None
        out: dict[str, Any] = {"content": chunk.text, "stop": False}
        if body.n_probs:
            out["completion_probabilities"] = list(chunk.logprobs)
        return event(out)

    def failed(exc: LocalrunError) -> bytes:
        return event(stream_error_line(exc))

    async def finish() -> AsyncIterator[bytes]:
        yield event(_final(gen, body, started, "", []))

    if lead:
        yield event({"content": lead, "stop": False})
    opening = [first] if first is not None else []
    async for out in stream_tail(gen, opening, lambda chunk: (piece(chunk),), failed=failed, finish=finish):
        yield out


@documented(RerankBody, answers.Reranked)
@router.post("/rerank", response_model=None)
@router.post("/v1/rerank", response_model=None)
async def rerank(request: Request) -> dict[str, Any]:
    body: RerankBody = await parse_body(request, RerankBody)
    docs = body.docs()
    model = await pick_model(request, body.model)
    out = await session_call(
        request, model, "rerank", {"query": body.query, "documents": docs}, found=[("query", "rerank")]
    )
    order = sorted(range(len(docs)), key=lambda i: -out["scores"][i])[: body.top_n or len(docs)]
    results: list[dict[str, Any]] = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": out["scores"][i]}
        if body.return_documents:
            item["document"] = {"text": docs[i]}
        results.append(item)
    n = int(out["prompt_tokens"])
    request_stats(request).prompt_tokens = n
    return {
        "object": "list",
        "model": request_stats(request).model or model,
        "results": results,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    }


@documented(NativeEmbeddingBody, answers.NativeEmbeddings)
@router.post("/embeddings", response_model=None)
async def native_embeddings(request: Request) -> dict[str, Any] | list[dict[str, Any]]:
    """llama-server's shape for ``content``; OpenAI's route for an ``input`` body."""
    raw = await request.body()
    try:
        openai_shaped = isinstance(data := json.loads(raw or b"null"), dict) and "content" not in data
    except (ValueError, RecursionError):
        openai_shaped = True  # the OpenAI route's parser names the problem
    if openai_shaped:
        return await parse_and_embed(request)
    body: NativeEmbeddingBody = await parse_body(request, NativeEmbeddingBody)
    model = await pick_model(request, body.model)
    inputs = body.inputs()
    found = [("content", "embeddings")] + (
        [("content", "token_prompts")] if any(not isinstance(i, str) for i in inputs) else []
    )
    out = await session_call(request, model, "embed_tokens", {"inputs": inputs}, found=found)
    request_stats(request).prompt_tokens = int(out["prompt_tokens"])
    return [{"index": i, "embedding": rows} for i, rows in enumerate(out["embeddings"])]
