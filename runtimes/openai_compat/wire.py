"""Requests and answers of an upstream in OpenAI's wire shape: messages, sampling fields,
log-probabilities and streamed tool-call deltas. Kind-specific choices (llama.cpp-style
sampling knobs) follow the upstream's :class:`~localrun.runtimes.openai_compat.kinds.Kind`."""

from __future__ import annotations

import json
from typing import Any

from localrun.runtimes.openai_compat.kinds import Kind
from localrun.types import ChatRequest, CompletionRequest, Sampling


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


def openai_messages(req: ChatRequest) -> list[dict[str, Any]]:
    """Core messages in OpenAI's wire shape, tool calls and results included."""
    out = []
    for m in req.messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            msg["tool_calls"] = list(m.tool_calls)
            msg["content"] = m.content or None
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.name is not None and m.role in ("tool", "user", "assistant"):
            msg["name"] = m.name
        out.append(msg)
    return out


def sampling_body(s: Sampling, kind: Kind, *, chat: bool) -> dict[str, Any]:
    """Sampling as the upstream's request fields; llama.cpp-style knobs only where the kind takes them."""
    body = sampling_to_openai(s)
    if kind.extra_sampling:
        body.update(top_k=s.top_k, min_p=s.min_p)
        if s.repeat_penalty != 1.0:
            body["repetition_penalty"] = s.repeat_penalty
    if s.json_schema is not None:
        body["response_format"] = (
            {"type": "json_object"}
            if not s.json_schema
            else {"type": "json_schema", "json_schema": {"name": "answer", "schema": s.json_schema}}
        )
    if s.logprobs is not None:
        if chat:
            body["logprobs"] = True
            if s.logprobs:
                body["top_logprobs"] = s.logprobs
        else:
            body["logprobs"] = s.logprobs
    return body


def chat_body(req: ChatRequest, kind: Kind, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": openai_messages(req), **sampling_body(req.sampling, kind, chat=True)}
    if req.tools:
        body["tools"] = list(req.tools)
    if req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    return body


def completion_body(req: CompletionRequest, kind: Kind, model: str) -> dict[str, Any]:
    return {"model": model, "prompt": req.prompt, **sampling_body(req.sampling, kind, chat=False)}


def completion_logprobs(lp: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The completions API's parallel lists as ``Chunk.logprobs`` entries."""
    tokens = lp.get("tokens") or []
    values = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    out = []
    for i, token in enumerate(tokens):
        entry = {"token": token, "logprob": values[i] if i < len(values) else None, "bytes": list(str(token).encode())}
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else None
        if top:
            entry["top_logprobs"] = [{"token": t, "logprob": v, "bytes": list(str(t).encode())} for t, v in top.items()]
        out.append(entry)
    return tuple(out)


def chat_logprobs(lp: Any) -> tuple[dict[str, Any], ...]:
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        return tuple(lp["content"])
    if isinstance(lp, dict) and "tokens" in lp:
        return completion_logprobs(lp)
    return ()


class ToolCalls:
    """Tool-call deltas of a stream, joined by their index into whole calls."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, Any]] = {}

    def add(self, deltas: list[dict[str, Any]]) -> None:
        for d in deltas:
            call = self.calls.setdefault(
                int(d.get("index", len(self.calls))),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if d.get("id"):
                call["id"] = d["id"]
            fn = d.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            args = fn.get("arguments")
            call["function"]["arguments"] += args if isinstance(args, str) else (json.dumps(args) if args else "")

    def done(self) -> tuple[dict[str, Any], ...]:
        return tuple(self.calls[i] for i in sorted(self.calls))
