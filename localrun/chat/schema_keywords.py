"""Which JSON Schema keywords the grammar converter honours, which it refuses, and the
``allOf`` merge.

A keyword is in exactly one of: :data:`ANNOTATIONS` (say nothing about validity: ignored),
a type's keyword set (honoured by :mod:`localrun.chat.schema_grammar`), or :data:`REFUSED`
(a 400 naming it and why). Anything else is an unknown keyword, refused too, except ``x-``
vendor extensions, which are annotations by convention.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "example", "$schema", "$id", "$comment", "deprecated"}
    | {"readOnly", "writeOnly", "$defs", "definitions"}
)
GENERAL = frozenset({"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "nullable"})
STRING = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
ARRAY = frozenset({"items", "prefixItems", "minItems", "maxItems", "uniqueItems"})
OBJECT = frozenset(
    {"properties", "required", "additionalProperties", "minProperties", "maxProperties", "propertyNames"}
)
HONOURED = GENERAL | STRING | NUMBER | ARRAY | OBJECT

#: Keywords a grammar cannot enforce, and why (the 400 says it).
REFUSED = {
    "not": "a grammar cannot exclude what a subschema matches",
    "if": "conditional subschemas are not supported",
    "then": "conditional subschemas are not supported",
    "else": "conditional subschemas are not supported",
    "contains": "a grammar cannot require one item somewhere in an array",
    "minContains": "a grammar cannot count matching items",
    "maxContains": "a grammar cannot count matching items",
    "patternProperties": "property names by pattern are not supported",
    "dependentRequired": "dependencies between properties are not supported",
    "dependentSchemas": "dependencies between properties are not supported",
    "dependencies": "dependencies between properties are not supported",
    "unevaluatedProperties": "not supported; use additionalProperties",
    "unevaluatedItems": "not supported; use items",
    "additionalItems": "not supported; use prefixItems and items",
    "contentEncoding": "encoded content is not supported",
    "contentMediaType": "encoded content is not supported",
    "contentSchema": "encoded content is not supported",
    "$dynamicRef": "only local $ref is supported",
    "$recursiveRef": "only local $ref is supported",
    "$anchor": "only JSON-pointer $refs (#/...) are supported",
    "$dynamicAnchor": "only JSON-pointer $refs (#/...) are supported",
    "$recursiveAnchor": "only JSON-pointer $refs (#/...) are supported",
}

TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
#: Keywords that imply a type when ``type`` is absent.
IMPLIED = (("object", OBJECT), ("array", ARRAY), ("string", STRING), ("number", NUMBER))

Refuse = Callable[[str, str], Exception]

_LOWER = ("minimum", "minLength", "minItems", "minProperties")
_UPPER = ("maximum", "maxLength", "maxItems", "maxProperties")


def merge(a: dict[str, Any], b: dict[str, Any], refuse: Refuse) -> dict[str, Any]:
    """Two subschemas of one ``allOf`` as one schema (instances must match both).

    ``refuse(keyword, why)`` makes the error for a pair it cannot combine."""
    out = dict(a)
    for key, value in b.items():
        if key not in out or out[key] == value or key in ANNOTATIONS:
            out.setdefault(key, value)
            continue
        mine = out[key]
        if key == "properties" and isinstance(mine, dict) and isinstance(value, dict):
            props = dict(mine)
            for name, sub in value.items():
                props[name] = {"allOf": [props[name], sub]} if name in props else sub
            out[key] = props
        elif key == "required" and isinstance(mine, list) and isinstance(value, list):
            out[key] = mine + [r for r in value if r not in mine]
        elif key == "type":
            out[key] = _both_types(mine, value, refuse)
        elif key in _LOWER and _numbers(mine, value):
            out[key] = max(mine, value)
        elif key in _UPPER and _numbers(mine, value):
            out[key] = min(mine, value)
        elif key == "enum" and isinstance(mine, list) and isinstance(value, list):
            out[key] = [v for v in mine if v in value]
        elif key == "additionalProperties" and (mine is False or value is False):
            out[key] = False
        else:
            raise refuse(key, "allOf gives it two different values, which cannot be combined")
    return out


def _numbers(*values: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _both_types(mine: Any, value: Any, refuse: Refuse) -> Any:
    left = set(mine) if isinstance(mine, list) else {mine}
    right = set(value) if isinstance(value, list) else {value}
    if "number" in left and "integer" in right:
        left.add("integer")
    if "number" in right and "integer" in left:
        right.add("integer")
    both = [t for t in TYPES if t in left & right]
    if not both:
        raise refuse("type", f"allOf asks for types {sorted(left)} and {sorted(right)}, which no value has")
    return both[0] if len(both) == 1 else both


def child_path(path: str, key: str) -> str:
    """``path.key``, or ``path["key"]`` for a key that is not a plain name."""
    return f"{path}.{key}" if re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_$-]*", key) else f"{path}[{json.dumps(key)}]"
