"""Objects and arrays for :class:`localrun.chat.schema_grammar.SchemaGrammar`.

An object writes its required properties first, in ``properties`` order (a forced call's
``name`` before ``arguments``), then any subset of the optional ones in order, then — when
``additionalProperties`` allows — more properties whose names are none of the declared ones
(a trie of the declared names says "any string but these"). With no properties and no
``additionalProperties``, any object. An array is ``item ("," item){m-1,n-1}``: the count is
llama.cpp's repetition, never the items written out.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from localrun.chat.schema_keywords import ANNOTATIONS, child_path
from localrun.chat.schema_regex import class_char
from localrun.chat.schema_terms import gbnf_literal

if TYPE_CHECKING:
    from localrun.chat.schema_grammar import SchemaGrammar

#: A property name's characters where names are free: JSON text that needs no escape.
MAX_NAME = 256
KEY_CHAR = '[^"\\\\\\x7F\\x00-\\x1F]'


def _prop_path(path: str, name: str) -> str:
    return child_path(f"{path}.properties", name)


def object_rule(g: SchemaGrammar, schema: dict[str, Any], path: str, depth: int) -> str:
    props = schema.get("properties") or {}
    required = schema.get("required") or []
    extra = schema.get("additionalProperties")
    if not isinstance(props, dict):
        raise g.refuse(f"{path}.properties", "properties must be an object")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise g.refuse(f"{path}.required", "required must be a list of names")
    if extra is not None and not isinstance(extra, bool | dict):
        raise g.refuse(f"{path}.additionalProperties", "additionalProperties must be a boolean or a schema")
    if not props and not required and extra in (None, True, {}):
        _check_counts(g, schema, path, free=True, declared=0, needed=0)
        _property_names(g, schema, path, [], free=True)
        return g.prim("object")
    names = list(props) + [r for r in dict.fromkeys(required) if r not in props]
    _property_names(g, schema, path, names, free=extra not in (None, False))
    names.sort(key=lambda n: g.order.get(n, len(g.order)))
    space = g.prim("space")
    kvs = {}
    for name in names:
        value = g.visit(props[name], _prop_path(path, name), depth + 1) if name in props else g.prim("value")
        key = gbnf_literal(json.dumps(name, ensure_ascii=False))
        kvs[name] = g.add(f"{name}-kv", f'{key} {space} ":" {space} {value}')
    extra_kv = None
    if extra not in (None, False):
        value = g.visit(extra, f"{path}.additionalProperties", depth + 1)
        key = _key_not_in(g, names)
        extra_kv = g.add("additional-kv", f'{key} ":" {space} {value}')
    _check_counts(g, schema, path, free=extra_kv is not None, declared=len(names), needed=len(set(required)))
    req = [kvs[n] for n in names if n in required]
    opt = [kvs[n] for n in names if n not in required]
    more = f' ("," {space} {extra_kv})*' if extra_kv else ""
    tails = _tails(g, opt, more, space)
    if req:
        body = f' "," {space} '.join(req) + (f" {tails[0]}" if tails else more)
    else:
        firsts = [f"{kv}{' ' + tails[i + 1] if i + 1 < len(tails) else more}" for i, kv in enumerate(opt)]
        if extra_kv:
            firsts.append(f"{extra_kv}{more}")
        body = "(" + " | ".join(firsts) + ")?"
    return g.add(path.rsplit(".", 1)[-1] + "-object", f'"{{" {space} {body} "}}" {space}')


def _tails(g: SchemaGrammar, opt: list[str], more: str, space: str) -> list[str]:
    """tails[i]: any ordered subset of the optional properties i..n, each after a comma, then
    the additional ones: one rule each, so n optional properties cost n rules, not n²."""
    tails: list[str] = []
    after = more.strip()
    for kv in reversed(opt):
        body = f'("," {space} {kv})?' + (f" {after}" if after else "")
        after = g.add(f"{kv}-tail", body)
        tails.insert(0, after)
    return tails


def _check_counts(
    g: SchemaGrammar, schema: dict[str, Any], path: str, *, free: bool, declared: int, needed: int
) -> None:
    """minProperties/maxProperties only where the object's shape already keeps them."""
    low, high = schema.get("minProperties"), schema.get("maxProperties")
    if low is not None and not (isinstance(low, int) and low <= needed):
        raise g.refuse(
            f"{path}.minProperties", f"minProperties {low} is only supported up to the required count ({needed})"
        )
    if high is not None and not (isinstance(high, int) and not free and high >= declared):
        raise g.refuse(
            f"{path}.maxProperties",
            "maxProperties is only supported when the declared properties already keep it (no additionalProperties)",
        )


def _property_names(g: SchemaGrammar, schema: dict[str, Any], path: str, names: list[str], free: bool) -> None:
    """``propertyNames`` is kept when every name the grammar can write passes it: always for
    ``{"type": "string"}`` (what zod writes for a record: Claude Code's task tools), else only
    when the names are the declared ones and each of them passes; free names are refused."""
    rule = schema.get("propertyNames")
    if rule is None or rule is True or _names_any_string(rule):
        return
    where = f"{path}.propertyNames"
    if not isinstance(rule, dict | bool):
        raise g.refuse(where, "propertyNames must be a schema")
    if free:
        raise g.refuse(where, 'property-name schemas other than {"type": "string"} need additionalProperties: false')
    import jsonschema

    try:
        check = jsonschema.Draft202012Validator(rule)
        wrong = next((n for n in names if not check.is_valid(n)), None)
    except jsonschema.SchemaError as e:
        raise g.refuse(where, f"propertyNames is not a valid schema: {e.message}") from None
    if wrong is not None:
        raise g.refuse(where, f"the declared property {wrong!r} does not pass propertyNames")


def _names_any_string(rule: Any) -> bool:
    return isinstance(rule, dict) and rule.get("type", "string") == "string" and set(rule) <= ANNOTATIONS | {"type"}


def _key_not_in(g: SchemaGrammar, names: list[str]) -> str:
    """A JSON string, then space, that is none of ``names``."""
    space = g.prim("space")
    long = next((n for n in names if len(n) > MAX_NAME), None)
    if long is not None:
        raise g.refuse(
            _prop_path(g.path, long[:40] + "…"),
            f"a property name over {MAX_NAME} characters next to additionalProperties is not supported",
        )
    if not names:
        return g.add("free-key", f'"\\"" {KEY_CHAR}* "\\"" {space}')
    trie: dict[str, Any] = {}
    for name in names:
        if any(c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7F for c in name):
            continue  # free names are written with plain characters only: they can never spell this one
        node = trie
        for ch in name:
            node = node.setdefault(ch, {})
        node[""] = {}
    counter = [0]

    def rule(node: dict[str, Any]) -> str:
        counter[0] += 1
        children = sorted(c for c in node if c)
        alts = [f"{gbnf_literal(c)} {rule(node[c])}" for c in children]
        excluded = "".join(class_char(ord(c)) for c in children)
        alts.append(f'[^{excluded}"\\\\\\x7F\\x00-\\x1F] {KEY_CHAR}*')
        if "" not in node:
            alts.append('""')
        return g.add(f"key-not-{counter[0]}", " | ".join(alts))

    return g.add("other-key", f'"\\"" {rule(trie)} "\\"" {space}')


def _prefix(g: SchemaGrammar, prefix: Any, path: str, depth: int, high: int | None) -> list[str]:
    if prefix is None:
        return []
    if not isinstance(prefix, list):
        raise g.refuse(f"{path}.prefixItems", "prefixItems must be a list of schemas")
    fixed = [g.visit(s, f"{path}.prefixItems[{i}]", depth + 1) for i, s in enumerate(prefix)]
    if high is not None and len(fixed) > high:
        raise g.refuse(f"{path}.maxItems", f"maxItems {high} is below the {len(fixed)} prefixItems")
    return fixed


def array_rule(g: SchemaGrammar, schema: dict[str, Any], path: str, depth: int) -> str:
    items, prefix = schema.get("items"), schema.get("prefixItems")
    if isinstance(items, list):  # draft 4-7 tuple form
        prefix, items = items, schema.get("additionalItems", False)
    low = g.count(schema, "minItems", path) or 0
    high = g.count(schema, "maxItems", path)
    if high is not None and high < low:
        raise g.refuse(f"{path}.maxItems", f"maxItems {high} is below minItems {low}")
    space = g.prim("space")
    fixed = _prefix(g, prefix, path, depth, high)
    if prefix is not None and items is None:
        items = low > len(fixed)
    rest_low = max(0, low - len(fixed))
    rest_high = None if high is None else high - len(fixed)
    item = None if items is False else g.visit(True if items is None else items, f"{path}.items", depth + 1)
    if item is None:
        if rest_low > 0:
            raise g.refuse(f"{path}.minItems", f"minItems {low} needs more items than prefixItems allows")
        rest_high = 0
    parts = f' "," {space} '.join(fixed)
    if rest_high == 0 or item is None:
        body = parts
    else:
        sep = g.add(f"{item}-next", f'"," {space} {item}')
        top = "" if rest_high is None else str(rest_high - 1)
        if fixed:
            body = f"{parts} {sep}{{{rest_low},{'' if rest_high is None else rest_high}}}"
        elif rest_low >= 1:
            body = f"{item} {sep}{{{rest_low - 1},{top}}}"
        else:
            body = f"({item} {sep}{{0,{top}}})?"
    inner = f" {body}" if body else ""
    return g.add(path.rsplit(".", 1)[-1] + "-array", f'"[" {space}{inner} "]" {space}')
