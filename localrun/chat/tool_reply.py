"""Call or reply: tools for models whose chat template has no tool syntax of its own, on a
runtime that can hold the whole answer to a grammar (llama.cpp).

llama-server's answer for such templates (its "generic" format): the system prompt asks for one
JSON object, either a call or a reply, and a grammar holds the whole answer to that shape::

    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    {"tool_calls": [{"name": …, "arguments": …}, …]}      (parallel_tool_calls: true)
    {"response": "It is sunny in Paris."}

Then the answer is unwrapped: the ``response`` string becomes the content, the call becomes a
tool call. A small model that would never open a ``<tool_call>`` tag on its own (the lazy Hermes
fallback, :mod:`localrun.chat.tool_triggers`) has to choose at its first token, and a call that
starts is held to its schema (the grammar: :mod:`localrun.runtimes.llamacpp.reply_grammar`).

* :func:`applies` — whether a request on a template gets this treatment (setting
  ``runtime.tool_fallback``: ``tagged``, the default lazy Hermes fallback, or ``call_or_reply``;
  the functions here take the fallback as an argument and default to ``call_or_reply``).
* :func:`prompt_messages` — the messages with the system block (:data:`REPLY_SYSTEM`); earlier
  calls are written back in the wrapper's form, tool results as ``<tool_response>`` user turns.
* :func:`with_reply` — the chunk stream unwrapped: the ``response`` string is decoded as it is
  generated (JSON escapes, ``\\uXXXX`` surrogate pairs split across pieces) and streams as
  content; no JSON of the wrapper reaches the client. A reasoning model's reasoning before the
  wrapper passes through untouched (the front end splits it off).

Runtimes without grammars (Ollama, MLX, upstreams) keep the Hermes prompt: a wrapper the model
is free to break would turn every reply into JSON text to repair. Pure Python.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from localrun.chat import tools
from localrun.chat.tool_calls import arguments_object, parse_tool_calls
from localrun.chat.tool_reply_decode import ReplyUnwrapper, ThinkGate
from localrun.types import ChatRequest, Chunk, Message

__all__ = [
    "CALL_OR_REPLY",
    "FALLBACKS",
    "REPLY_SYSTEM",
    "TAGGED",
    "ReplyUnwrapper",
    "applies",
    "has_tool_syntax",
    "prompt_messages",
    "system_block",
    "with_reply",
]

log = logging.getLogger(__name__)

CALL_OR_REPLY, TAGGED = "call_or_reply", "tagged"
#: The values of ``runtime.tool_fallback``.
FALLBACKS = (CALL_OR_REPLY, TAGGED)

REPLY_SYSTEM = (
    "You can call these functions (JSON Schema signatures):\n{tools}\n\n"
    "Answer with exactly one JSON object and nothing else.\n{shapes}\n"
    "Results of calls come back in <tool_response></tool_response>."
)
"""The system block of a call-or-reply request; ``{shapes}`` says which objects may be written."""

_ONE = '{"tool_call": {"name": <function name>, "arguments": <arguments object>}}'
_MANY = '{"tool_calls": [{"name": <function name>, "arguments": <arguments object>}, ...]}'
_REPLY = '{"response": "<your answer to the user>"}'


#: Traces of a call syntax the model was trained on, in a template that does not read ``tools``
#: (earlier calls rendered in history, a family's call markers): such a model keeps its tags.
_SYNTAX_TRACES = ("tool_call", "[TOOL_CALLS]", "<|python_tag|>", "<function=")


def has_tool_syntax(template: str | None) -> bool:
    """The template takes ``tools`` or shows how its model writes calls."""
    if not template:
        return False
    return tools.template_uses_tools(template) or any(t in template for t in _SYNTAX_TRACES)


def applies(req: ChatRequest, template: str | None, fallback: str = CALL_OR_REPLY) -> bool:
    """Whether ``req`` on ``template`` is answered as call-or-reply: tools are offered, the
    template has no tool syntax (:func:`has_tool_syntax`), the fallback is ``call_or_reply``,
    and the request asks for no JSON schema or raw grammar of its own (those keep theirs)."""
    sampling = req.sampling
    return (
        fallback == CALL_OR_REPLY
        and tools.active(req)
        and not has_tool_syntax(template)
        and sampling.json_schema is None
        and sampling.grammar is None
    )


def _forced_name(req: ChatRequest) -> str | None:
    choice = req.tool_choice
    if isinstance(choice, dict):
        return str((choice.get("function") or {}).get("name") or choice.get("name") or "")
    return None


def system_block(req: ChatRequest) -> str:
    """The system block: the tools' signatures and the JSON objects this request may answer with."""
    listing = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in req.tools)
    call = _MANY if req.parallel_tool_calls is True else _ONE
    forced = _forced_name(req)
    if forced:
        shapes = f"Call the function {forced}:\n{call}"
    elif req.tool_choice == "required":
        shapes = f"Call a function:\n{call}"
    else:
        # Worded call-first: a small model reads "to answer directly" as the answer to give
        # (Gemma 3 270M preferred the reply on 16 of 16 questions that way, the call on 15 of 16 this way).
        shapes = f"If a function can answer the request, call it:\n{call}\nOtherwise reply:\n{_REPLY}"
    return REPLY_SYSTEM.format(tools=listing, shapes=shapes)


def _wrapped_call_turn(m: Message) -> Message:
    """An earlier assistant turn with calls, written as the wrapper the model is asked for."""
    calls = [
        {
            "name": (c.get("function") or {}).get("name"),
            "arguments": arguments_object((c.get("function") or {}).get("arguments", {})),
        }
        for c in m.tool_calls
    ]
    body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
    text = json.dumps(body, ensure_ascii=False)
    return replace(m, content=f"{m.content}\n{text}" if m.content else text, tool_calls=())


def prompt_messages(req: ChatRequest) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages as dicts, extra template variables) for a call-or-reply request."""
    history = tuple(_wrapped_call_turn(m) if m.tool_calls else m for m in req.messages)
    msgs, variables = tools.prompt_messages(replace(req, messages=history, tool_choice="none"), None)
    block = system_block(req)
    if msgs and msgs[0]["role"] == "system":
        msgs[0] = {**msgs[0], "content": f"{msgs[0]['content']}\n\n{block}"}
    else:
        msgs.insert(0, {"role": "system", "content": block})
    return msgs, variables


def with_reply(chunks: Iterator[Chunk], req: ChatRequest, reasoning: str | None = None) -> Iterator[Chunk]:
    """Unwrap a call-or-reply answer: content as it is generated, calls on the last chunk.

    ``reasoning``: where the answer starts relative to a reasoning block (``open``: the prompt
    opened it; ``optional``: one may come first; None: the answer starts at once), as the
    grammar was built. The reasoning's text passes through as it was written.

    A length cut inside the reply keeps the content so far (finish ``length``); a cut inside a
    call drops the unfinished call's JSON (it is no answer) and finishes ``length``.
    """
    names = tools.tool_names(req.tools)
    states: dict[int, tuple[ThinkGate, ReplyUnwrapper, list[dict[str, Any]]]] = {}  # per choice (n > 1)
    try:
        for chunk in chunks:
            if chunk.index not in states:
                states[chunk.index] = (ThinkGate(reasoning), ReplyUnwrapper(), [])
            gate, unwrap, held_lp = states[chunk.index]
            passed, answer = gate.feed(chunk.text)
            out = passed + unwrap.feed(answer)
            if chunk.finish_reason is None:
                if out:
                    yield replace(chunk, text=out, logprobs=(*held_lp, *chunk.logprobs))
                    held_lp.clear()
                else:
                    held_lp.extend(chunk.logprobs)
                continue
            passed, answer = gate.finish()
            out += passed + unwrap.feed(answer)
            tail, calls = _finish(unwrap, names, cut=chunk.finish_reason == "length")
            yield tools.closing_chunk(chunk, out + tail, calls, held_lp, chunk.call_deltas)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _finish(unwrap: ReplyUnwrapper, names: tuple[str, ...], *, cut: bool) -> tuple[str, list[dict[str, Any]]]:
    """(content still to emit, calls) once the answer has ended."""
    value, raw = unwrap.finish()
    if value is None:
        if raw.strip() and not cut:  # not the wrapper (no grammar held it): lose nothing
            log.debug("call-or-reply answer is not the wrapper's JSON; kept as content")
            return raw, []
        return "", []
    if isinstance(value, dict):
        found = value.get("tool_calls", value.get("tool_call"))
        if found is not None:
            _, calls = parse_tool_calls(json.dumps(found, ensure_ascii=False), names)
            if calls:
                return "", calls
        elif "response" in value:  # a reply that was not a string (no grammar held it)
            reply = value["response"]
            return reply if isinstance(reply, str) else json.dumps(reply, ensure_ascii=False), []
    return raw, []
