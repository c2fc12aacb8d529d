"""Recognising tool calls in a model's answer, whatever family wrote it.

:func:`parse_tool_calls` reads a whole answer: Hermes / Qwen ``<tool_call>…</tool_call>``
(also with ``<function=name>`` inside), Mistral ``[TOOL_CALLS]`` (a JSON list, or
``name[ARGS]{…}`` with an optional ``[CALL_ID]``), Llama 3.x JSON (``{"name",
"parameters"|"arguments"}``, one, a list, or several joined by ``;``, optionally after
``<|python_tag|>`` or in a code fence), ``<function=name>{…}</function>`` and pythonic
``[f(a=1)]`` (parsed with ``ast``, values by ``literal_eval`` only). Only names of the
request's tools count, so an answer that merely is JSON stays content, and anything
malformed is left as content: a caller never loses text to a parser that guessed wrong.

:class:`ToolCallFilter` is the streaming side: text flows through until something that may
start a call appears, and what is held back is parsed at the end. Pure Python.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from localrun.chat.tool_formats import LEADS, MARKERS, STARTS, parse_native

log = logging.getLogger(__name__)

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"
#: Markers that may start a call anywhere in an answer.
_MARKERS = (TAG_OPEN, "[TOOL_CALLS]", "<|python_tag|>", "<function=")
#: The end of a reasoning block (DeepSeek-R1, Qwen3…): a call is only looked for after it.
_THINK_CLOSE = "</think>"
#: Characters that may start a bare JSON or pythonic call, only at the start of an answer.
_LEADING = ("{", "[", "```")


def new_call_id() -> str:
    """An OpenAI-style call id (``call_`` + 24 hex digits); unique enough to pair results."""
    return "call_" + secrets.token_hex(12)


def arguments_object(arguments: Any) -> Any:
    """OpenAI sends arguments as a JSON string; templates and Ollama want the object (a bad string stays as is)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def openai_calls(raw: Any) -> list[dict[str, Any]]:
    """Ollama's calls (arguments as objects, an ``id`` from newer versions) in OpenAI's shape."""
    out = []
    for c in raw or ():
        if not isinstance(c, dict):
            continue
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args if args is not None else {}, ensure_ascii=False)
        ident = c.get("id") if isinstance(c.get("id"), str) and c.get("id") else new_call_id()
        out.append({"id": ident, "type": "function", "function": {"name": str(fn.get("name", "")), "arguments": args}})
    return out


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
        args = arguments_object(args)
    return {
        "id": new_call_id(),
        "type": "function",
        "function": {
            "name": name,
            "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
        },
    }


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
    pattern = re.compile(re.escape(TAG_OPEN) + r"(.*?)(?:" + re.escape(TAG_CLOSE) + r"|\Z)", re.S)
    found = list(pattern.finditer(text))
    calls: list[dict[str, Any]] = []
    for i, m in enumerate(found):
        inner = m.group(1).strip()
        fn = re.fullmatch(r"<function=([\w.-]+)>(.*?)(?:</function>)?", inner, re.S)
        parsed = _json_prefix(fn.group(2) if fn else inner)
        obj = {"name": fn.group(1), "arguments": parsed[0]} if fn and parsed else (parsed[0] if parsed else None)
        call = _as_call(obj, names)
        cut_short = i == len(found) - 1 and i > 0 and not m.group(0).endswith(TAG_CLOSE)
        if call is None and cut_short:  # the length limit ended the last of several calls: it stays text
            return (pattern.sub("", text[: m.start()]).strip() + "\n" + m.group(0)).strip(), calls
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
        args = _json_prefix(part[m.end() :]) if m else None
        call = _as_call({"name": m.group(1), "arguments": args[0]}, names) if m and args else None
        if call is None:
            return None
        calls.append(call)
    return (head.strip(), calls) if calls else None


def parse_tool_calls(
    text: str, names: Sequence[str], family: str | None = None, params: Mapping[str, Any] | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """(content left over, calls in OpenAI's shape) recognised in a whole answer.

    ``family``: a native call syntax (:mod:`.tool_formats`) tried first; ``params``: each
    tool's parameters schema by name (the XML families type their values with it).
    An answer with no recognisable call, or a malformed one, is all content: a caller
    never loses text to a parser that guessed wrong.
    """
    reasoning, close, answer = text.rpartition(_THINK_CLOSE)
    if close:  # calls come after the reasoning; one it mentions is not made, and its text stays whole
        content, found = parse_tool_calls(answer, names, family, params)
        return (reasoning + close + content, found) if found else (text, [])
    known = frozenset(names)
    if family in LEADS:
        text = text.removeprefix(LEADS[family])
    native = parse_native(family, text, known, params)
    if native is not None:
        return native
    if TAG_OPEN in text:
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
    if parsed is not None and not body[parsed[1] :].strip():
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
        if parsed is None or part[parsed[1] :].strip():
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

    __slots__ = ("_names", "_started", "_held", "_holding", "_family", "_params", "_markers", "_starts", "_lead")

    def __init__(
        self, names: Sequence[str], family: str | None = None, params: Mapping[str, Any] | None = None
    ) -> None:
        self._names = tuple(names)
        self._family, self._params = family, params  # a native call syntax (.tool_formats) and the tools' schemas
        self._markers = _MARKERS + MARKERS.get(family or "", ())
        self._lead = LEADS.get(family or "")  # Functionary 3.2: "all\n" or a tool's name opens the answer
        self._starts = (
            _LEADING
            + self._markers
            + STARTS.get(family or "", ())
            + (tuple(f"{n}\n" for n in self._names) if self._lead else ())
        )
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
            starts = self._starts
            if self._lead is not None:  # structure that opens the answer, not content: dropped
                if self._lead.startswith(pending):  # too short to tell yet
                    self._held = pending
                    return ""
                pending = pending.removeprefix(self._lead)
                lead, self._lead = pending.lstrip(), None
            if any(lead.startswith(p) for p in starts):
                self._held, self._holding = pending, True
                return ""
            if not lead or any(p.startswith(lead) for p in starts):  # too short to tell yet
                self._held = pending
                return ""
            self._started = True
        for marker in self._markers:
            at = pending.find(marker)
            if at >= 0:
                self._held, self._holding = pending[at:], True
                return pending[:at]
        hold = 0
        for marker in self._markers:  # a marker's beginning at the very end: wait for the next piece
            for k in range(min(len(marker) - 1, len(pending)), hold, -1):
                if pending.endswith(marker[:k]):
                    hold = k
                    break
        self._held = pending[len(pending) - hold :]
        return pending[: len(pending) - hold]

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        held, self._held = self._held, ""
        if not held.strip():
            return held, []
        return parse_tool_calls(held, self._names, self._family, self._params)
