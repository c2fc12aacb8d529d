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

**Out of the answer.** :class:`ToolCallFilter` streams text through, holding back from the
first thing that may start a call; at the end, :func:`parse_tool_calls` recognises Hermes /
Qwen ``<tool_call>…</tool_call>``, Mistral ``[TOOL_CALLS]`` (JSON list or ``name[ARGS]{…}``),
Llama 3.x JSON (``{"name", "parameters"|"arguments"}``, optionally after ``<|python_tag|>``),
``<function=name>{…}</function>`` and pythonic ``[f(a=1)]``. Only names of the request's
tools count as calls, so an answer that merely is JSON stays content.

**Forced calls.** ``tool_choice="required"`` or a named function: :func:`forced_call` gives a
JSON Schema of one call plus the literal text around it for this template's style; the
runtime compiles it to a grammar, so the model can only emit a valid call.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from localrun.errors import UnsupportedFeature
from localrun.types import ChatRequest, Chunk

log = logging.getLogger(__name__)

FALLBACK_SYSTEM = (
    "You can call these functions (JSON Schema signatures):\n{tools}\n\n"
    "To call a function, answer with one line per call, exactly:\n"
    '<tool_call>{{"name": <function name>, "arguments": <arguments object>}}</tool_call>\n'
    "and nothing else. Results come back in <tool_response></tool_response>. "
    "If no function is needed, answer normally."
)
"""The system block for templates that do not take ``tools`` themselves."""

_TAG_OPEN, _TAG_CLOSE = "<tool_call>", "</tool_call>"
#: Markers that may start a call anywhere in an answer.
_MARKERS = (_TAG_OPEN, "[TOOL_CALLS]", "<|python_tag|>", "<function=")
#: Characters that may start a bare JSON or pythonic call, only at the start of an answer.
_LEADING = ("{", "[", "```")


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


def new_call_id() -> str:
    """An OpenAI-style call id (``call_`` + 24 hex digits); unique enough to pair results."""
    return "call_" + secrets.token_hex(12)


def template_uses_tools(template: str | None) -> bool:
    """True when the template reads a ``tools`` variable (parsed, not a substring guess)."""
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
    if not template_uses_tools(template):
        return HERMES
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


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    fn["arguments"] = _arguments_object(fn.get("arguments", {}))
    return {"id": call.get("id"), "type": call.get("type", "function"), "function": fn,
            "name": fn.get("name"), "arguments": fn["arguments"]}


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    body = {"name": fn.get("name"), "arguments": _arguments_object(fn.get("arguments", {}))}
    return f"{_TAG_OPEN}{json.dumps(body, ensure_ascii=False)}{_TAG_CLOSE}"


def prompt_messages(req: ChatRequest, template: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages as dicts, extra template variables) for rendering ``req`` with ``template``.

    Messages without tool fields and a request without tools come back as plain role /
    content dicts, so the prompt is exactly what it was before tools existed.
    """
    offer = bool(req.tools) and req.tool_choice != "none"
    if template_uses_tools(template):
        msgs = []
        for m in req.messages:
            d: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                d["tool_calls"] = [_call_for_template(c) for c in m.tool_calls]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            if m.name is not None:
                d["name"] = m.name
            msgs.append(d)
        return msgs, ({"tools": [dict(t) for t in req.tools]} if offer else {})
    return _fallback_messages(req, offer), {}


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
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, args_key: params},
            "required": ["name", args_key], "additionalProperties": False}


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
            raise UnsupportedFeature(f"tool_choice names {wanted!r}, which is not among the request's tools",
                                     param="tool_choice", hint="name one of the functions in 'tools'")
    elif choice != "required":
        raise UnsupportedFeature(f"tool_choice {choice!r} is not one of none, auto, required or a named function",
                                 param="tool_choice", hint="use 'auto', 'none', 'required' or {'type': 'function', ...}")
    options = [_call_schema(f, style.args_key) for f in functions]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    if style.as_list:
        return ForcedCall(schema, style.prefix + "[", "]")
    return ForcedCall(schema, style.prefix, style.suffix)


# --- out of the answer -------------------------------------------------------------------


def _as_call(obj: Any, names: frozenset[str]) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or (names and name not in names):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = _arguments_object(args)
    return {"id": new_call_id(), "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}


def _json_prefix(text: str) -> tuple[Any, int] | None:
    """The JSON value at the start of ``text`` (after whitespace) and where it ends."""
    stripped = len(text) - len(text.lstrip())
    try:
        return json.JSONDecoder().raw_decode(text, stripped)
    except ValueError:
        return None


def _calls_from_json(value: Any, names: frozenset[str]) -> list[dict[str, Any]] | None:
    items = value if isinstance(value, list) else [value]
    calls = [_as_call(v, names) for v in items]
    return calls if items and all(calls) else None  # type: ignore[return-value]


def _pythonic(text: str, names: frozenset[str]) -> list[dict[str, Any]] | None:
    """``[f(a=1), g(b="x")]`` (Llama 3.2 / 4): parsed with ``ast``, values with literal_eval only."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args):
            return None
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
        except (ValueError, SyntaxError):
            return None
        call = _as_call({"name": node.func.id, "arguments": args}, names)
        if call is None:
            return None
        calls.append(call)
    return calls


def _hermes(text: str, names: frozenset[str]) -> tuple[str, list[dict[str, Any]]] | None:
    pattern = re.compile(re.escape(_TAG_OPEN) + r"(.*?)(?:" + re.escape(_TAG_CLOSE) + r"|\Z)", re.S)
    found = list(pattern.finditer(text))
    calls = []
    for m in found:
        inner = m.group(1).strip()
        fn = re.fullmatch(r"<function=([\w.-]+)>(.*?)(?:</function>)?", inner, re.S)
        parsed = _json_prefix(fn.group(2) if fn else inner)
        obj = {"name": fn.group(1), "arguments": parsed[0]} if fn and parsed else (parsed[0] if parsed else None)
        call = _as_call(obj, names)
        if call is None:
            return None
        calls.append(call)
    return (pattern.sub("", text).strip(), calls) if calls else None


def _mistral(text: str, names: frozenset[str]) -> tuple[str, list[dict[str, Any]]] | None:
    head, _, rest = text.partition("[TOOL_CALLS]")
    parsed = _json_prefix(rest)
    if parsed is not None:
        calls = _calls_from_json(parsed[0], names)
        return (head.strip(), calls) if calls else None
    calls = []
    for part in rest.split("[TOOL_CALLS]"):
        m = re.match(r"\s*([\w.-]+)(?:\[CALL_ID\][\w-]*)?\[ARGS\]", part)
        args = _json_prefix(part[m.end():]) if m else None
        call = _as_call({"name": m.group(1), "arguments": args[0]}, names) if m and args else None
        if call is None:
            return None
        calls.append(call)
    return (head.strip(), calls) if calls else None


def parse_tool_calls(text: str, names: Sequence[str]) -> tuple[str, list[dict[str, Any]]]:
    """(content left over, calls in OpenAI's shape) recognised in a whole answer.

    An answer with no recognisable call, or a malformed one, is all content: a caller
    never loses text to a parser that guessed wrong.
    """
    known = frozenset(names)
    if _TAG_OPEN in text:
        return _hermes(text, known) or (text, [])
    if "[TOOL_CALLS]" in text:
        return _mistral(text, known) or (text, [])
    body = text.strip()
    head = ""
    if "<|python_tag|>" in body:
        head, _, body = body.partition("<|python_tag|>")
    fn = re.fullmatch(r"<function=([\w.-]+)>(.*?)(?:</function>)?", body, re.S)
    if fn:
        args = _json_prefix(fn.group(2))
        call = _as_call({"name": fn.group(1), "arguments": args[0]}, known) if args else None
        return (head.strip(), [call]) if call else (text, [])
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.S)
    if fence:
        body = fence.group(1)
    parsed = _json_prefix(body)
    if parsed is not None and not body[parsed[1]:].strip():
        calls = _calls_from_json(parsed[0], known)
        if calls:
            return head.strip(), calls
    for sep_calls in (_split_semicolons(body, known), _pythonic(body, known)):
        if sep_calls:
            return head.strip(), sep_calls
    return text, []


def _split_semicolons(body: str, names: frozenset[str]) -> list[dict[str, Any]] | None:
    """Llama 3.1 sometimes writes several JSON calls separated by ``;``."""
    if ";" not in body:
        return None
    calls = []
    for part in body.split(";"):
        parsed = _json_prefix(part)
        if parsed is None or part[parsed[1]:].strip():
            return None
        call = _as_call(parsed[0], names)
        if call is None:
            return None
        calls.append(call)
    return calls


class ToolCallFilter:
    """Streams an answer's text, holding back from where a tool call may start.

    ``feed`` returns the text that is surely content; ``finish`` parses what was held and
    returns (content still to emit, calls).
    """

    __slots__ = ("_names", "_started", "_held", "_holding")

    def __init__(self, names: Sequence[str]) -> None:
        self._names = tuple(names)
        self._started = False  # any non-space content emitted yet
        self._held = ""
        self._holding = False  # a marker was seen: hold everything to the end

    def feed(self, text: str) -> str:
        if self._holding:
            self._held += text
            return ""
        pending = self._held + text
        if not self._started:
            lead = pending.lstrip()
            starts = _LEADING + _MARKERS
            if any(lead.startswith(p) for p in starts):
                self._held, self._holding = pending, True
                return ""
            if not lead or any(p.startswith(lead) for p in starts):  # too short to tell yet
                self._held = pending
                return ""
            self._started = True
        for marker in _MARKERS:
            at = pending.find(marker)
            if at >= 0:
                self._held, self._holding = pending[at:], True
                return pending[:at]
        hold = 0
        for marker in _MARKERS:  # a marker's beginning at the very end: wait for the next piece
            for k in range(min(len(marker) - 1, len(pending)), hold, -1):
                if pending.endswith(marker[:k]):
                    hold = k
                    break
        self._held = pending[len(pending) - hold:]
        return pending[:len(pending) - hold]

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        held, self._held = self._held, ""
        if not held.strip():
            return held, []
        return parse_tool_calls(held, self._names)


def with_tool_calls(chunks: Iterator[Chunk], req: ChatRequest) -> Iterator[Chunk]:
    """Wrap a runtime's chunk stream: call text never reaches the client as content; the
    last chunk carries the parsed calls and ``finish_reason="tool_calls"``.

    Log-probabilities of held-back text travel with the next chunk that is emitted, so
    none is lost or duplicated.
    """
    filt = ToolCallFilter(tool_names(req.tools))
    held_lp: list[dict[str, Any]] = []
    for chunk in chunks:
        out = filt.feed(chunk.text)
        if chunk.finish_reason is None:
            if out:
                yield replace(chunk, text=out, logprobs=(*held_lp, *chunk.logprobs))
                held_lp.clear()
            else:
                held_lp.extend(chunk.logprobs)
            continue
        tail, calls = filt.finish()
        reason = chunk.finish_reason
        if calls and reason in ("stop", "length"):
            reason = "tool_calls"
        yield replace(chunk, text=out + tail, finish_reason=reason, tool_calls=tuple(calls) or chunk.tool_calls,
                      logprobs=(*held_lp, *chunk.logprobs))
        return
