"""Tool calling for runtimes that generate raw text: how tool definitions reach the prompt,
how calls are recognised in the answer, and what a forced call must look like.

Pure Python, no runtime import: the llama.cpp session and the fake runtime share it.

**Into the prompt.** When the GGUF's chat template uses a ``tools`` variable (Qwen, Llama
3.x, Mistral, Hermes…), the definitions go there, and history turns keep their
``tool_calls`` / ``tool_call_id`` / ``name`` with arguments as objects, as Hugging Face
templates expect. Otherwise a documented fallback: a system block (:data:`FALLBACK_SYSTEM`)
lists the tools and asks for ``<tool_call>{json}</tool_call>`` (the Hermes form, the most
common in the wild); earlier calls are written back in that form and tool results become
a user turn wrapped in ``<tool_response>``, so templates that only know user/assistant
(Gemma) still render the conversation.

**Out of the answer.** :func:`with_tool_calls` wraps a runtime's chunk stream: content
streams through :class:`~localrun.chat.tool_calls.ToolCallFilter`, which holds back from the
first thing that may start a call, and the held text is parsed at the end
(:func:`~localrun.chat.tool_calls.parse_tool_calls`: Hermes/Qwen, Mistral, Llama 3.x JSON,
``<function=…>`` and pythonic calls). Only names of the request's tools count as calls.
While the held text grows, :class:`~localrun.chat.tool_stream.CallStream` streams each call
(start, arguments' JSON text piece by piece, end) as ``Chunk.call_deltas``.

**Forced calls.** ``tool_choice="required"`` or a named function: :func:`forced_call` gives a
JSON Schema of one call plus the literal text around it for this template's style; the
runtime compiles it to a grammar, so the model can only emit a valid call.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from localrun.chat.tool_calls import (
    TAG_CLOSE,
    TAG_OPEN,
    ToolCallFilter,
    arguments_object,
    new_call_id,
    parse_tool_calls,
)
from localrun.chat.tool_formats import ARGS_AS_TEXT, GRANITE, NATIVE_FAMILIES, native_family
from localrun.chat.tool_stream import CallStream
from localrun.errors import UnsupportedFeature
from localrun.types import CallDelta, ChatRequest, Chunk, Message

__all__ = [
    "FALLBACK_SYSTEM",
    "ForcedCall",
    "ToolCallFilter",
    "ToolStyle",
    "active",
    "forced_call",
    "new_call_id",
    "parse_tool_calls",
    "prompt_messages",
    "template_uses_tools",
    "tool_names",
    "tool_style",
    "with_tool_calls",
]

log = logging.getLogger(__name__)

FALLBACK_SYSTEM = (
    "You can call these functions (JSON Schema signatures):\n{tools}\n\n"
    "To call a function, answer with one line per call, exactly:\n"
    '<tool_call>{{"name": <function name>, "arguments": <arguments object>}}</tool_call>\n'
    "and nothing else. Results come back in <tool_response></tool_response>. "
    "If no function is needed, answer normally."
)
"""The system block for templates that do not take ``tools`` themselves."""


@dataclass(frozen=True)
class ToolStyle:
    """How a model family writes a call: the text around it and the arguments key."""

    name: str
    prefix: str
    suffix: str
    args_key: str = "arguments"
    as_list: bool = False  # Mistral v3: a JSON list of calls


HERMES = ToolStyle("hermes", "<tool_call>\n", "\n</tool_call>")
MISTRAL = ToolStyle("mistral", "[TOOL_CALLS]", "", as_list=True)
LLAMA3 = ToolStyle("llama3", "", "", args_key="parameters")
BARE_JSON = ToolStyle("json", "", "")
#: Families with a native call syntax (:mod:`.tool_formats`): a forced call's JSON is ``{"name", "arguments"}``
#: for the schema, and the runtime's grammar writes the family's own markers around it.
NATIVE = {f: ToolStyle(f, "", "") for f in NATIVE_FAMILIES} | {
    GRANITE: ToolStyle(GRANITE, "<|tool_call|>", "", as_list=True)
}


@functools.lru_cache(maxsize=32)
def template_uses_tools(template: str | None) -> bool:
    """True when the template reads a ``tools`` variable (parsed, not a substring guess).

    Cached: a model's template is the same string on every request, and parsing a 10 KB
    template costs ~50 ms, twice per chat request otherwise."""
    if not template or "tools" not in template:
        return False
    try:
        from jinja2 import Environment, meta

        ast_ = Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
        return "tools" in meta.find_undeclared_variables(ast_)
    except Exception:  # noqa: BLE001 - an unparsable template fails later, in the sandboxed render, with its own error
        return False


def tool_style(template: str | None) -> ToolStyle:
    """The call format this template's model was trained on (Hermes for the fallback)."""
    if template is None or not template_uses_tools(template):
        return HERMES
    family = native_family(template)
    if family is not None:
        return NATIVE[family]
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<tool_call>" in template:
        return HERMES
    if "<|python_tag|>" in template or "ipython" in template:
        return LLAMA3
    return BARE_JSON


def tool_names(tools: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(str((t.get("function") or {}).get("name", "")) for t in tools if isinstance(t, dict))


def active(req: ChatRequest) -> bool:
    """Whether the answer may hold tool calls to recognise."""
    return bool(req.tools) and req.tool_choice != "none"


# --- into the prompt ---------------------------------------------------------------------


def _call_for_template(call: dict[str, Any], as_text: bool = False) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    fn["arguments"] = arguments_object(fn.get("arguments", {}))
    if as_text and not isinstance(fn["arguments"], str):  # Functionary 3.2 concatenates the JSON text
        fn["arguments"] = json.dumps(fn["arguments"], ensure_ascii=False)
    return {
        "id": call.get("id"),
        "type": call.get("type", "function"),
        "function": fn,
        "name": fn.get("name"),
        "arguments": fn["arguments"],
    }


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    body = {"name": fn.get("name"), "arguments": arguments_object(fn.get("arguments", {}))}
    return f"{TAG_OPEN}{json.dumps(body, ensure_ascii=False)}{TAG_CLOSE}"


def prompt_messages(req: ChatRequest, template: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages as dicts, extra template variables) for rendering ``req`` with ``template``.

    Messages without tool fields and a request without tools come back as plain role /
    content dicts, so the prompt is exactly what it was before tools existed.
    """
    offer = bool(req.tools) and req.tool_choice != "none"
    if template_uses_tools(template):
        msgs = []
        as_text = tool_style(template).name in ARGS_AS_TEXT
        for m in req.messages:
            d: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                d["tool_calls"] = [_call_for_template(c, as_text) for c in m.tool_calls]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            if m.name is not None:
                d["name"] = m.name
            _add_reasoning(d, m, template)
            msgs.append(d)
        return msgs, ({"tools": [dict(t) for t in req.tools]} if offer else {})
    return _fallback_messages(req, offer), {}


def _add_reasoning(d: dict[str, Any], m: Message, template: str | None) -> None:
    """An assistant turn's reasoning where the template looks for it, as llama-server passes it:
    ``reasoning_content`` (Qwen3, DeepSeek), and for a turn with calls also ``thinking``, which
    gpt-oss's template reads (it refuses both ``thinking`` and content on a call turn, so only
    a template that names ``message.thinking`` gets it). A template that reads neither drops it."""
    if not m.reasoning:
        return
    d["reasoning_content"] = m.reasoning
    if m.tool_calls and template and "message.thinking" in template and not m.content:
        d["thinking"] = m.reasoning


def _fallback_messages(req: ChatRequest, offer: bool) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for m in req.messages:
        if m.role == "tool":
            label = f' name="{m.name}"' if m.name else ""
            text = f"<tool_response{label}>\n{m.content}\n</tool_response>"
            if msgs and msgs[-1].get("_tool_result"):  # consecutive results: one user turn
                msgs[-1]["content"] += "\n" + text
            else:
                msgs.append({"role": "user", "content": text, "_tool_result": True})
            continue
        content = m.content
        if m.tool_calls:
            calls = "\n".join(_call_text(c) for c in m.tool_calls)
            content = f"{content}\n{calls}" if content else calls
        msgs.append({"role": m.role, "content": content})
        _add_reasoning(msgs[-1], replace(m, tool_calls=()), None)
    for d in msgs:
        d.pop("_tool_result", None)
    if offer:
        listing = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in req.tools)
        block = FALLBACK_SYSTEM.format(tools=listing)
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {"role": "system", "content": f"{msgs[0]['content']}\n\n{block}"}
        else:
            msgs.insert(0, {"role": "system", "content": block})
    return msgs


# --- forced calls ------------------------------------------------------------------------


@dataclass(frozen=True)
class ForcedCall:
    """One call the model must emit: ``prefix`` + a JSON instance of ``schema`` + ``suffix``."""

    schema: dict[str, Any]
    prefix: str
    suffix: str


def _call_schema(fn: dict[str, Any], args_key: str) -> dict[str, Any]:
    params = fn.get("parameters") or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, args_key: params},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def forced_call(req: ChatRequest, style: ToolStyle) -> ForcedCall | None:
    """The call ``tool_choice`` demands, or None when the model may answer freely.

    Raises:
        UnsupportedFeature: ``tool_choice`` names a function that is not among ``tools``.
    """
    choice = req.tool_choice
    if not req.tools or choice in (None, "auto", "none"):
        return None
    functions = [t.get("function") or {} for t in req.tools]
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name") or choice.get("name")
        functions = [f for f in functions if f.get("name") == wanted]
        if not functions:
            raise UnsupportedFeature(
                f"tool_choice names {wanted!r}, which is not among the request's tools",
                param="tool_choice",
                hint="name one of the functions in 'tools'",
            )
    elif choice != "required":
        raise UnsupportedFeature(
            f"tool_choice {choice!r} is not one of none, auto, required or a named function",
            param="tool_choice",
            hint="use 'auto', 'none', 'required' or {'type': 'function', ...}",
        )
    options = [_call_schema(f, style.args_key) for f in functions]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    if style.as_list:
        return ForcedCall(schema, style.prefix + "[", "]")
    return ForcedCall(schema, style.prefix, style.suffix)


# --- out of the answer -------------------------------------------------------------------


def with_tool_calls(chunks: Iterator[Chunk], req: ChatRequest, template: str | None = None) -> Iterator[Chunk]:
    """Wrap a runtime's chunk stream: call text never reaches the client as content; each call
    streams as :class:`~localrun.types.CallDelta` s while it is written
    (:mod:`localrun.chat.tool_stream`), and the last chunk carries the parsed calls and
    ``finish_reason="tool_calls"``. A request that
    offers no tools (or says ``tool_choice="none"``) gets ``chunks`` back untouched.
    ``template``: the chat template the prompt was rendered with, whose native call syntax
    (:mod:`.tool_formats`) is read back too.

    Log-probabilities of held-back text travel with the next chunk that is emitted, so
    none is lost or duplicated. Closing this stream closes the runtime's at once (a
    scheduler frees the sequence), not whenever the garbage collector gets to it.
    """
    return _calls_parsed(chunks, req, template) if active(req) else chunks


def closing_chunk(
    chunk: Chunk,
    text: str,
    calls: Sequence[dict[str, Any]],
    held_lp: Sequence[dict[str, Any]],
    deltas: Sequence[CallDelta] = (),
) -> Chunk:
    """The answer's last chunk once its calls are parsed: the text still to emit, the calls (finish
    ``tool_calls`` when the answer stopped or was cut with calls), the held log-probabilities."""
    reason = chunk.finish_reason
    if calls and reason in ("stop", "length"):
        reason = "tool_calls"
    return replace(
        chunk,
        text=text,
        finish_reason=reason,
        tool_calls=tuple(calls) or chunk.tool_calls,
        logprobs=(*held_lp, *chunk.logprobs),
        call_deltas=tuple(deltas),
    )


def _native_filter(req: ChatRequest, template: str | None) -> ToolCallFilter:
    family = tool_style(template).name
    if family not in NATIVE_FAMILIES:
        return ToolCallFilter(tool_names(req.tools))
    functions = [t.get("function") or {} for t in req.tools if isinstance(t, dict)]
    params = {str(f.get("name", "")): f.get("parameters") for f in functions}
    return ToolCallFilter(tool_names(req.tools), family, params)


def _calls_parsed(chunks: Iterator[Chunk], req: ChatRequest, template: str | None) -> Iterator[Chunk]:
    names = tool_names(req.tools)
    filt = _native_filter(req, template)
    # A native family's calls (DeepSeek, Kimi, GLM…) have no incremental reader yet: each goes out
    # whole when the answer ends; the JSON families' arguments stream as they are written.
    native = tool_style(template).name in NATIVE_FAMILIES
    calls_so_far = CallStream(frozenset(names), {} if native else None)
    held_lp: list[dict[str, Any]] = []
    seen, sent = "", 0  # the answer's text so far, and how much of it went out as content
    try:
        for chunk in chunks:
            out = filt.feed(chunk.text)
            seen += chunk.text
            sent += len(out)
            deltas = _deltas(calls_so_far, seen, sent)
            if chunk.finish_reason is None:
                if out:
                    yield replace(chunk, text=out, logprobs=(*held_lp, *chunk.logprobs), call_deltas=tuple(deltas))
                    held_lp.clear()
                else:
                    held_lp.extend(chunk.logprobs)
                    if deltas:  # the held text's log-probabilities still wait for text to ride with
                        yield replace(chunk, text="", logprobs=(), call_deltas=tuple(deltas))
                continue
            tail, calls = filt.finish()
            yield closing_chunk(chunk, out + tail, calls_so_far.settle(calls), held_lp, deltas)
            return
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _deltas(calls: CallStream, seen: str, sent: int) -> list[CallDelta]:
    """The calls' deltas for what the filter holds now (``seen[sent:]``), none inside reasoning:
    a call there is not made (the parse looks after ``</think>``), so nothing of it may go out."""
    if sent == len(seen):
        return []
    content = seen[:sent]
    if content.rfind("<think>") > content.rfind("</think>"):
        return []
    return calls.feed(seen[sent:], sent, at_start=not content.strip())
