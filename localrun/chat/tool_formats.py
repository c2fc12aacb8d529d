"""Model families that write tool calls in their own native syntax, not as a JSON object with a
``name`` key: which family a chat template speaks, and how its calls read back.

Pure Python. :func:`native_family` reads the chat template (markers the template writes its
earlier calls with, as llama.cpp's ``common/chat.cpp`` detects them); :func:`parse_native`
reads a whole answer in that family's syntax; :data:`MARKERS` are the strings that may open a
call there (the streaming filter holds back from them). Each family's grammar, which makes
every call that starts valid, is :mod:`localrun.runtimes.llamacpp.native_grammar`.

Families and their calls:

* ``deepseek`` (DeepSeek R1 / V3):
  ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{…}\\n```<｜tool▁call▁end｜>``
  … ``<｜tool▁calls▁end｜>``; the V3.1 form ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>``
  also reads back.
* ``kimi`` (Kimi K2): ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0``
  ``<|tool_call_argument_begin|>{…}<|tool_call_end|>`` … ``<|tool_calls_section_end|>``.
* ``granite`` (Granite 3.x): ``<|tool_call|>[{"name": …, "arguments": {…}}, …]``.
* ``functionary3.1``: ``<function=NAME>{…}</function>``.
* ``functionary3.2``: ``>>>NAME\\n{…}`` (the prompt ends with ``>>>``; text goes to the recipient ``all``).
* ``gpt-oss``: ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`` (or
  `` to=functions.NAME<|channel|>commentary json<|message|>{…}``), after the analysis channel.
* ``qwen3-coder``: ``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n…</function>\\n</tool_call>``.
* ``glm`` (GLM 4.5+): ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n…</tool_call>``.

In the two XML families a string value is the raw text, any other value JSON.

Only names of the request's tools count, a call inside reasoning is not made (the caller cuts
``</think>``; an analysis channel's text is never a call header), and anything malformed stays
content: a parser returns None and the answer is content, or, when the last of several calls is
cut short, the calls before it and the rest as content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from localrun.chat.tool_xml import GLM, QWEN3_CODER, Calls, make_call, parse_xml

__all__ = [
    "ARGS_AS_TEXT",
    "GLM",
    "QWEN3_CODER",
    "Calls",
    "MARKERS",
    "make_call",
    "NATIVE_FAMILIES",
    "LEADS",
    "STARTS",
    "native_family",
    "parse_native",
]

DEEPSEEK, KIMI, GRANITE = "deepseek", "kimi", "granite"
FUNCTIONARY_31, FUNCTIONARY_32, GPT_OSS = "functionary3.1", "functionary3.2", "gpt-oss"
NATIVE_FAMILIES = (DEEPSEEK, KIMI, GRANITE, FUNCTIONARY_31, FUNCTIONARY_32, GPT_OSS, QWEN3_CODER, GLM)

DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
KIMI_CALLS, KIMI_CALLS_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KIMI_CALL, KIMI_ARGS, KIMI_CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
GRANITE_CALL = "<|tool_call|>"

#: family -> strings that may open a call anywhere in an answer (the streaming filter holds from them).
MARKERS: dict[str, tuple[str, ...]] = {
    DEEPSEEK: (DS_CALLS, DS_CALL),
    KIMI: (KIMI_CALLS, KIMI_CALL),
    GRANITE: (GRANITE_CALL,),
    FUNCTIONARY_31: ("<function=",),
    FUNCTIONARY_32: (">>>",),
    GPT_OSS: tuple(f"<|start|>assistant{c} to=" for c in ("", "<|channel|>commentary", "<|channel|>analysis")),
    QWEN3_CODER: ("<tool_call>",),
    GLM: ("<tool_call>",),
}


def native_family(template: str) -> str | None:
    """The native call family of a template that takes ``tools``, or None (not one of these)."""
    if "<|channel|>" in template and "functions." in template:
        return GPT_OSS
    if ">>>all" in template and ">>>${recipient}" in template:
        return FUNCTIONARY_32
    if KIMI_CALLS in template and KIMI_CALL in template:
        return KIMI
    if DS_CALLS in template and DS_SEP in template:
        return DEEPSEEK
    if GRANITE_CALL in template:
        return GRANITE
    if "<tool_call>" in template and "<arg_key>" in template:
        return GLM
    if "<tool_call>" in template and "<function=" in template and "<parameter=" in template:
        return QWEN3_CODER
    if "'<function='" in template and "</function>" in template and "<parameter=" not in template:
        return FUNCTIONARY_31
    return None


#: Families whose templates write an earlier call's arguments as the JSON text they are given (``+ arguments``).
ARGS_AS_TEXT = frozenset({FUNCTIONARY_32})
#: family -> strings that open a call only at the very start of an answer (the prompt ended a header).
STARTS: dict[str, tuple[str, ...]] = {
    GPT_OSS: ("to=functions.", "<|channel|>commentary to=", "<|channel|>analysis to=")
}
#: family -> text an answer may start with that is structure, not content (Functionary 3.2's recipient).
LEADS: dict[str, str] = {FUNCTIONARY_32: "all\n"}


# --- reading calls back ------------------------------------------------------------------------

Parsed = tuple[str, Calls] | None


def _json_at(text: str) -> tuple[Any, str] | None:
    """The JSON value at the start of ``text`` (after spaces and an optional code fence) and the rest."""
    body = text.lstrip()
    fenced = body.startswith("```")
    if fenced:
        body = re.sub(r"^```(?:json)?\s*", "", body)
    try:
        value, end = json.JSONDecoder().raw_decode(body)
    except ValueError:
        return None
    rest = body[end:]
    if fenced:
        rest = re.sub(r"^\s*```", "", rest)
    return value, rest


def _sequence(
    head: str, bodies: list[tuple[str, str, bool]], one: Callable[[str], dict[str, Any] | None], opener: str
) -> Parsed:
    """Calls from ``bodies`` (text, what follows the call, closed); the last may be cut short.

    A malformed call makes the whole answer content, unless it is the last, unclosed, after
    good ones: those are made and its text stays content."""
    calls: Calls = []
    tail: list[str] = []
    for i, (body, after, closed) in enumerate(bodies):
        call = one(body)
        if call is None:
            if calls and i == len(bodies) - 1 and not closed:
                return (head + "".join(tail) + opener + body).strip(), calls
            return None
        calls.append(call)
        tail.append(after)
    return ((head + "".join(tail)).strip(), calls) if calls else None


def _split(
    text: str, opens: tuple[str, ...], call: str, close: str, section_end: str
) -> tuple[str, list[tuple[str, str, bool]]]:
    """(text before the first opener, [(call body, text after it, closed)]) for bracketed calls."""
    at = min((i for i in (text.find(o) for o in opens) if i >= 0), default=len(text))
    head, rest = text[:at], text[at:]
    for o in opens:
        rest = rest.removeprefix(o) if o != call else rest
    bodies = []
    for part in rest.split(call)[1:] if call in rest else [rest]:
        body, closed, after = part.partition(close)
        if not closed:
            body, _, after = body.partition(section_end)
        after = after.replace(section_end, "")
        bodies.append((body, after, bool(closed)))
    return head, bodies


def _deepseek(text: str, names: frozenset[str]) -> Parsed:
    def one(body: str) -> dict[str, Any] | None:
        kind, sep, rest = body.partition(DS_SEP)
        if not sep:
            return None
        if kind.strip() in ("function", ""):  # R1: type<sep>name, then a fenced JSON
            name, _, rest = rest.partition("\n")
        else:  # V3.1: name<sep>JSON
            name = kind
        parsed = _json_at(rest)
        return make_call(name, parsed[0], names) if parsed and not parsed[1].strip() else None

    head, bodies = _split(text, (DS_CALLS, DS_CALL), DS_CALL, DS_CALL_END, DS_CALLS_END)
    return _sequence(head, bodies, one, DS_CALL)


def _kimi(text: str, names: frozenset[str]) -> Parsed:
    def one(body: str) -> dict[str, Any] | None:
        ident, sep, rest = body.partition(KIMI_ARGS)
        m = re.fullmatch(r"\s*(?:functions\.)?([\w.-]+?)(?::\d+)?\s*", ident)
        parsed = _json_at(rest) if sep and m else None
        return make_call(m.group(1), parsed[0], names) if m and parsed and not parsed[1].strip() else None

    head, bodies = _split(text, (KIMI_CALLS, KIMI_CALL), KIMI_CALL, KIMI_CALL_END, KIMI_CALLS_END)
    return _sequence(head, bodies, one, KIMI_CALL)


def _granite(text: str, names: frozenset[str]) -> Parsed:
    head, _, rest = text.partition(GRANITE_CALL)
    parsed = _json_at(rest)
    if parsed is None:
        return None
    items = parsed[0] if isinstance(parsed[0], list) else [parsed[0]]
    calls = [
        make_call(str(v.get("name", "")), v.get("arguments", {}), names) if isinstance(v, dict) else None for v in items
    ]
    if not items or not all(calls):
        return None
    return (head + parsed[1]).strip(), [c for c in calls if c]


def _functionary31(text: str, names: frozenset[str]) -> Parsed:
    def one(body: str) -> dict[str, Any] | None:
        name, sep, rest = body.partition(">")
        parsed = _json_at(rest) if sep else None
        return make_call(name, parsed[0], names) if parsed and not parsed[1].strip() else None

    head, bodies = _split(text, ("<function=",), "<function=", "</function>", "\x00")
    return _sequence(head, bodies, one, "<function=")


def _functionary32(text: str, names: frozenset[str]) -> Parsed:
    content: list[str] = []
    calls: Calls = []
    segments = text.split(">>>")
    for i, seg in enumerate(segments):
        recipient, newline, body = seg.partition("\n")
        if recipient.strip() == "all" and newline:
            content.append(body)
            continue
        parsed = _json_at(body) if newline else None
        call = make_call(recipient, parsed[0], names) if parsed and not parsed[1].strip() else None
        if call is not None:
            calls.append(call)
        elif i == 0:
            content.append(seg)  # no recipient: the model wrote plain text
        elif calls and i == len(segments) - 1:
            content.append(">>>" + seg)  # the last call cut short stays text
        else:
            return None
    return ("".join(content).strip(), calls) if calls else None


_HARMONY_CALL = re.compile(
    r"(?:<\|start\|>assistant)?\s*(?:<\|channel\|>(?:commentary|analysis))?\s*to=functions\.([\w.-]+)\s*"
    r"(?:<\|channel\|>(?:commentary|analysis))?\s*(?:<\|constrain\|>)?\s*(?:json)?\s*<\|message\|>"
)
_HARMONY_BOUNDARY = ("<|end|>", "<|call|>", "<|start|>assistant", "<|return|>")


def _gpt_oss(text: str, names: frozenset[str]) -> Parsed:
    calls: Calls = []
    kept: list[str] = []
    pos = 0
    for m in _HARMONY_CALL.finditer(text):
        before = text[: m.start()].rstrip()
        if m.start() < pos or (before and not before.endswith(_HARMONY_BOUNDARY)):
            continue  # inside a message (the analysis channel's text): not a header
        parsed = _json_at(text[m.end() :])
        call = make_call(m.group(1), parsed[0], names) if parsed else None
        if call is None or parsed is None:
            return None
        kept.append(text[pos : m.start()])
        calls.append(call)
        rest = parsed[1]
        rest = rest.lstrip().removeprefix("<|call|>") if rest.lstrip().startswith("<|call|>") else rest
        pos = len(text) - len(rest)
    if not calls:
        return None
    kept.append(text[pos:])
    return "".join(kept).strip(), calls


_PARSERS: dict[str, Callable[[str, frozenset[str]], Parsed]] = {
    DEEPSEEK: _deepseek,
    KIMI: _kimi,
    GRANITE: _granite,
    FUNCTIONARY_31: _functionary31,
    FUNCTIONARY_32: _functionary32,
    GPT_OSS: _gpt_oss,
}


def parse_native(
    family: str | None, text: str, names: frozenset[str], params: Mapping[str, Any] | None = None
) -> Parsed:
    """(content, calls) of an answer in ``family``'s syntax, or None (no call of that family here).

    ``params``: each tool's parameters schema by name, which the XML families need to tell a
    string value from a JSON one."""
    if family is None:
        return None
    if family in _PARSERS:
        return _PARSERS[family](text, names)
    return parse_xml(family, text, names, params or {})
