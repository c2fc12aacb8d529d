"""Reading back tool calls in the two XML-shaped native syntaxes (see :mod:`.tool_formats`):

* ``qwen3-coder`` (Qwen3-Coder, Qwen3.5, Nemotron 3, Step 3.5):
  ``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n…</function>\\n</tool_call>``
* ``glm`` (GLM 4.5 – 4.7, Ling, Spark):
  ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n…</tool_call>``

A value whose property the tool's schema types as a string is the raw text (Qwen3-Coder's one
new line on each side dropped); any other value is JSON, and one that does not parse makes the
call malformed, so the answer stays content. A property the schema does not know is read as
JSON when it parses, else as the text. Pure Python.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Any

__all__ = ["GLM", "QWEN3_CODER", "Calls", "is_string_schema", "make_call", "parse_xml"]

QWEN3_CODER, GLM = "qwen3-coder", "glm"
Calls = list[dict[str, Any]]


def make_call(name: str, args: Any, names: frozenset[str]) -> dict[str, Any] | None:
    """A call in OpenAI's shape, or None when ``name`` is not one of ``names`` or ``args`` not an object."""
    name = name.strip()
    if not name or (names and name not in names) or not isinstance(args, dict):
        return None
    text = json.dumps(args, ensure_ascii=False)
    return {"id": "call_" + secrets.token_hex(12), "type": "function", "function": {"name": name, "arguments": text}}


_TAG_OPEN, _TAG_CLOSE = "<tool_call>", "</tool_call>"
_QWEN_FUNCTION = re.compile(r"\s*<function=([\w.-]+)>(.*?)(?:</function>\s*)?\Z", re.S)
_QWEN_PARAM = re.compile(r"\s*<parameter=([\w.-]+)>\n?(.*?)\n?</parameter>", re.S)
_GLM_NAME = re.compile(r"\s*([\w.-]+)\s*(.*?)\Z", re.S)
_GLM_ARG = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def is_string_schema(schema: Any) -> bool:
    """A property whose every value is a string: written raw in the XML families."""
    if not isinstance(schema, dict):
        return False
    if schema.get("type") == "string":
        return True
    options = schema.get("enum") or ([schema["const"]] if "const" in schema else [])
    return bool(options) and all(isinstance(v, str) for v in options)


def _allows_string(schema: Any) -> bool:
    """No type said, or one of several is a string: a value that is not JSON is its text."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    return (
        kind is None
        and not (isinstance(schema, dict) and "enum" in schema)
        or (isinstance(kind, list) and "string" in kind)
    )


def _value(raw: str, schema: Any) -> tuple[bool, Any]:
    if is_string_schema(schema):
        return True, raw
    try:
        return True, json.loads(raw)
    except ValueError:
        return schema is None or _allows_string(schema), raw  # a property the schema does not know: its text


def _args(pairs: list[tuple[str, str]], schema: Any) -> dict[str, Any] | None:
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    args: dict[str, Any] = {}
    for key, raw in pairs:
        ok, value = _value(raw, props.get(key) if isinstance(props, dict) else None)
        if not ok:
            return None
        args[key] = value
    return args


def _one(family: str, body: str, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    if family == QWEN3_CODER:
        fn = _QWEN_FUNCTION.fullmatch(body)
        if fn is None:
            return None
        name, inner, pattern = fn.group(1), fn.group(2), _QWEN_PARAM
    else:
        fn = _GLM_NAME.fullmatch(body)
        if fn is None:
            return None
        name, inner, pattern = fn.group(1), fn.group(2), _GLM_ARG
    pairs, pos = [], 0
    for m in pattern.finditer(inner):
        if inner[pos : m.start()].strip():
            return None
        pairs.append((m.group(1).strip(), m.group(2)))
        pos = m.end()
    if inner[pos:].strip():
        return None
    args = _args(pairs, params.get(name))
    return (name, args) if args is not None else None


def parse_xml(
    family: str, text: str, names: frozenset[str], params: Mapping[str, Any]
) -> tuple[str, list[dict[str, Any]]] | None:
    """(content, calls) of ``<tool_call>`` blocks in ``family``'s XML syntax, or None."""
    if family == QWEN3_CODER and _TAG_OPEN not in text and "<function=" in text:  # Qwen3-Coder may drop the outer tag
        text = text.replace("<function=", _TAG_OPEN + "<function=")
    if family not in (QWEN3_CODER, GLM) or _TAG_OPEN not in text:
        return None
    head, _, rest = text.partition(_TAG_OPEN)
    parts = rest.split(_TAG_OPEN)
    calls: Calls = []
    tail: list[str] = []
    for i, part in enumerate(parts):
        body, closed, after = part.partition(_TAG_CLOSE)
        found = _one(family, body, params)
        call = make_call(found[0], found[1], names) if found else None
        if call is None:
            if calls and i == len(parts) - 1 and not closed:
                return (head + "".join(tail) + _TAG_OPEN + part).strip(), calls
            return None
        calls.append(call)
        tail.append(after)
    return (head + "".join(tail)).strip(), calls
