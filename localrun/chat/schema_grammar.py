"""JSON Schema → GBNF, localrun's own converter (llama.cpp's ``json-schema-to-grammar`` was the
reference for its facts: the primitives, integer ranges as digit grammars, property order).

Every keyword is either honoured or refused with a 400 naming it and its JSON path
(``tools[3].function.parameters.properties.when.format``); see
:mod:`localrun.chat.schema_keywords` for the lists and ``docs/structured-output.md`` for the
table. The grammar always matches a subset of the schema's instances and never nothing, so a
model constrained by it can always finish with a valid value. Repetitions are written with
GBNF counts (``item{0,99}``), never spelled out, and every count, the nesting depth, the rule
count and the grammar size are bounded (:class:`SchemaLimits`) before llama.cpp sees anything;
the result is then read by :func:`localrun.chat.gbnf.check_gbnf` like a client's grammar.

Not enforced (documented): ``oneOf`` is compiled as ``anyOf`` (a value matching two branches is
possible); without ``additionalProperties`` an object gets only its declared properties (a
stricter, still valid, reading); ``prefixItems`` arrays are written with all their items.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from localrun.chat import schema_keywords as kw
from localrun.chat.gbnf_parse import MAX_REPEAT
from localrun.chat.schema_keywords import child_path as _child
from localrun.chat.schema_objects import array_rule, object_rule
from localrun.chat.schema_regex import pattern_gbnf
from localrun.chat.schema_terms import FORMATS, PRIMITIVES, int_range, json_literal, number_range, repeat
from localrun.errors import UnsupportedFeature

#: Fraction digits of a bounded number (no exponent there).
FRACTION_DIGITS = 15
_MAX_BOUND = 10**18


@dataclass(frozen=True)
class SchemaLimits:
    """What one schema may cost; each refusal names the limit."""

    max_depth: int = 64
    max_repeat: int = MAX_REPEAT  # the grammar's own cap (gbnf_parse)
    max_rules: int = 20_000
    max_bytes: int = 4_000_000
    max_enum: int = 2000


DEFAULT_SCHEMA_LIMITS = SchemaLimits()


class SchemaGrammar:
    """One schema's grammar being built: rules by name, shared when their bodies are equal."""

    def __init__(self, schema: Any, *, path: str, limits: SchemaLimits, prop_order: tuple[str, ...] = ()) -> None:
        self.root, self.path, self.limits = schema, path, limits
        self.order = {name: i for i, name in enumerate(prop_order)}
        self.rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}
        self._refs: dict[tuple[int, str], str] = {}
        self._bases: list[Any] = [schema]
        #: Names the caller's grammar uses around this one (its root rule).
        self.reserved = {"root", "call"}

    # --- rules -------------------------------------------------------------------------

    def refuse(self, where: str, why: str, hint: str = "") -> UnsupportedFeature:
        shown = where if len(where) <= 240 else f"{where[:100]}…{where[-100:]}"
        return UnsupportedFeature(
            f"{shown}: {why}",
            param=where,
            hint=hint or "remove or change that keyword; docs/structured-output.md lists what a grammar can enforce",
        )

    def _name(self, hint: str) -> str:
        base = re.sub(r"[^A-Za-z0-9-]+", "-", hint).strip("-").lower()[:40] or "r"
        name, n = base, 1
        while name in self.rules or name in PRIMITIVES or name in self.reserved:
            n += 1
            name = f"{base}-{n}"
        return name

    def add(self, hint: str, body: str) -> str:
        found = self._by_body.get(body)
        if found is not None:
            return found
        if len(self.rules) >= self.limits.max_rules:
            raise self.refuse(self.path, f"the schema needs more than {self.limits.max_rules} grammar rules")
        name = self._name(hint)
        self.rules[name] = body
        self._by_body[body] = name
        return name

    def prim(self, name: str) -> str:
        todo = [name]
        while todo:
            item = todo.pop()
            if item not in self.rules:
                body, deps = PRIMITIVES[item]
                self.rules[item] = body
                todo.extend(deps)
        return name

    def grammar(self, root_rule: str, top: str) -> str:
        lines = [f"{root_rule} ::= {top}"] if root_rule != top else []
        lines += [f"{name} ::= {body}" for name, body in self.rules.items() if name != root_rule]
        text = "\n".join(lines) + "\n"
        if len(text) > self.limits.max_bytes:
            raise self.refuse(
                self.path, f"the schema's grammar is {len(text)} bytes; the limit is {self.limits.max_bytes}"
            )
        return text

    # --- schemas -----------------------------------------------------------------------

    def visit(self, schema: Any, path: str, depth: int) -> str:
        """The rule for a JSON value matching ``schema``."""
        if depth > self.limits.max_depth:
            raise self.refuse(
                path, f"the schema nests deeper than {self.limits.max_depth} levels", "flatten the schema"
            )
        if schema is True or schema == {}:
            return self.prim("value")
        if schema is False:
            raise self.refuse(path, "the schema false matches nothing")
        if not isinstance(schema, dict):
            raise self.refuse(path, f"a schema must be an object or a boolean, not {type(schema).__name__}")
        pushed = "$defs" in schema or "definitions" in schema
        if pushed:
            self._bases.append(schema)
        try:
            return self._visit(schema, path, depth)
        finally:
            if pushed:
                self._bases.pop()

    def keywords(self, schema: dict[str, Any], path: str) -> list[str]:
        """The schema's keywords that constrain, each one honoured (else the 400 naming it)."""
        keys = [k for k in schema if k not in kw.ANNOTATIONS and not k.startswith("x-")]
        for key in keys:
            if key in kw.REFUSED:
                if key == "additionalItems" and schema[key] is False:
                    continue
                raise self.refuse(_child(path, key), kw.REFUSED[key])
            if key not in kw.HONOURED:
                raise self.refuse(_child(path, key), f"unknown keyword {key!r}")
        if schema.get("uniqueItems") is True:
            raise self.refuse(_child(path, "uniqueItems"), "a grammar cannot keep array items distinct")
        return keys

    def _visit(self, schema: dict[str, Any], path: str, depth: int) -> str:
        keys = self.keywords(schema, path)
        if "$ref" in keys:
            others = [k for k in keys if k != "$ref"]
            if others:
                raise self.refuse(_child(path, others[0]), "keywords next to $ref are not supported; use allOf")
            return self.ref(schema["$ref"], _child(path, "$ref"), depth)
        if schema.get("nullable") is True:
            inner = self.visit({k: v for k, v in schema.items() if k != "nullable"}, path, depth + 1)
            return self.add(inner + "-or-null", f"{inner} | {self.prim('null')}")
        if "allOf" in keys:
            return self.visit(self.all_of(schema, path, depth), path, depth + 1)
        for key in ("anyOf", "oneOf"):
            if key in keys:
                return self.any_of(schema, key, path, depth)
        if "const" in keys or "enum" in keys:
            return self.literals(schema, keys, path)
        return self.by_type(schema, keys, path, depth)

    def by_type(self, schema: dict[str, Any], keys: list[str], path: str, depth: int) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind or any(t not in kw.TYPES for t in kind):
                raise self.refuse(_child(path, "type"), f"type must name JSON types, not {kind!r}")
            alts = [self.visit({**schema, "type": t}, path, depth + 1) for t in dict.fromkeys(kind)]
            return alts[0] if len(alts) == 1 else self.add(path.rsplit(".", 1)[-1] + "-types", " | ".join(alts))
        if kind is None:
            kind = next((t for t, words in kw.IMPLIED if any(k in words for k in keys)), None)
            if kind is None:
                return self.prim("value")
        return self.typed(kind, schema, path, depth)

    def typed(self, kind: Any, schema: dict[str, Any], path: str, depth: int) -> str:
        if kind == "object":
            return object_rule(self, schema, path, depth)
        if kind == "array":
            return array_rule(self, schema, path, depth)
        if kind == "string":
            return self.string(schema, path)
        if kind in ("integer", "number"):
            return self.number(schema, path, kind == "integer")
        if kind in ("boolean", "null"):
            return self.prim(kind)
        raise self.refuse(_child(path, "type"), f"unknown type {kind!r}")

    def lookup(self, ref: Any, path: str) -> tuple[Any, Any]:
        """(base, target) of a local ``$ref``: tried against the innermost schema with ``$defs``
        first (a tool's parameters), then outwards to the document."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise self.refuse(path, f"only local $refs (#/...) are supported, not {ref!r}")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in ref[1:].split("/")[1:]] if ref != "#" else []
        for base in reversed(self._bases):
            target: Any = base
            for part in parts:
                if isinstance(target, dict) and part in target:
                    target = target[part]
                elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                    target = target[int(part)]
                else:
                    break
            else:
                return base, target
        raise self.refuse(path, f"$ref {ref!r} points to nothing in the schema")

    def ref(self, ref: Any, path: str, depth: int) -> str:
        base, target = self.lookup(ref, path)
        key = (id(base), ref)
        if key not in self._refs:
            tail = ref.rsplit("/", 1)[-1] if ref != "#" else "root"
            name = self._name("ref-" + tail)
            self._refs[key] = name
            self.rules[name] = ""  # reserved: a recursive reference finds the name
            self.rules[name] = self.visit(target, path, depth + 1)
        return self._refs[key]

    def all_of(self, schema: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        parts = schema["allOf"]
        if depth > self.limits.max_depth:
            limit = self.limits.max_depth
            raise self.refuse(_child(path, "allOf"), f"allOf nests (through $refs too) deeper than {limit} levels")
        if not isinstance(parts, list) or not parts:
            raise self.refuse(_child(path, "allOf"), "allOf must be a non-empty list of schemas")
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for i, part in enumerate(parts):
            where = f"{path}.allOf[{i}]"
            for _ in range(self.limits.max_depth):
                if isinstance(part, dict) and "$ref" in part and len(part) == 1:
                    part = self.lookup(part["$ref"], where)[1]
                    depth += 1
                elif isinstance(part, dict) and "allOf" in part:
                    part = self.all_of(part, where, depth + 1)
                else:
                    break
            if part is True:
                continue
            if not isinstance(part, dict):
                raise self.refuse(where, "allOf parts must be schema objects")
            merged = kw.merge(merged, part, self._refuser(where))
        return merged

    def _refuser(self, where: str) -> kw.Refuse:
        def refuse(key: str, why: str) -> Exception:
            return self.refuse(_child(where, key), why)

        return refuse

    def any_of(self, schema: dict[str, Any], key: str, path: str, depth: int) -> str:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise self.refuse(_child(path, key), f"{key} must be a non-empty list of schemas")
        if "anyOf" in schema and "oneOf" in schema:
            raise self.refuse(_child(path, "oneOf"), "anyOf and oneOf together are not supported")
        siblings = {k: v for k, v in schema.items() if k != key and k not in kw.ANNOTATIONS}
        alts = []
        for i, branch in enumerate(branches):
            where = f"{path}.{key}[{i}]"
            sub = {"allOf": [siblings, branch]} if siblings else branch
            alts.append(self.visit(sub, where, depth + 1))
        alts = list(dict.fromkeys(alts))
        return alts[0] if len(alts) == 1 else self.add(f"{path.rsplit('.', 1)[-1]}-{key}", " | ".join(alts))

    def literals(self, schema: dict[str, Any], keys: list[str], path: str) -> str:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        key = "const" if "const" in schema else "enum"
        if not isinstance(values, list) or not values:
            raise self.refuse(_child(path, key), "enum must be a non-empty list")
        if len(values) > self.limits.max_enum:
            raise self.refuse(_child(path, key), f"{len(values)} values; the limit is {self.limits.max_enum}")
        extra = [k for k in keys if k not in ("const", "enum", "type")]
        if extra:
            raise self.refuse(_child(path, extra[0]), f"keywords next to {key} are not supported")
        if "type" in schema:
            allowed = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            values = [
                v for v in values if _json_type(v) in allowed or (_json_type(v) == "integer" and "number" in allowed)
            ]
            if not values:
                raise self.refuse(_child(path, key), "no value of the enum has the schema's type")
        body = " | ".join(dict.fromkeys(json_literal(v) for v in values))
        return self.add(path.rsplit(".", 1)[-1] + "-" + key, f"({body}) {self.prim('space')}")

    def string(self, schema: dict[str, Any], path: str) -> str:
        most = self.limits.max_repeat**2  # a string's length is written as counted blocks (schema_terms.repeat)
        lo, hi = self.count(schema, "minLength", path, most), self.count(schema, "maxLength", path, most)
        fmt, pattern = schema.get("format"), schema.get("pattern")
        if fmt is not None and pattern is not None:
            raise self.refuse(_child(path, "pattern"), "pattern together with format is not supported")
        for word, value in (("format", fmt), ("pattern", pattern)):
            if value is not None and ("minLength" in schema or "maxLength" in schema):
                raise self.refuse(_child(path, word), f"{word} together with minLength/maxLength is not supported")
        space = self.prim("space")
        if fmt is not None:
            if fmt not in FORMATS:
                known = ", ".join(sorted(FORMATS))
                raise self.refuse(_child(path, "format"), f"format {fmt!r} is not supported (supported: {known})")
            return self.add(f"{fmt}-string", f'"\\"" ({FORMATS[fmt]}) "\\"" {space}')
        if pattern is not None:
            if not isinstance(pattern, str):
                raise self.refuse(_child(path, "pattern"), "pattern must be a string")
            self.prim("char")
            inner = pattern_gbnf(
                pattern, max_repeat=self.limits.max_repeat, error=lambda why: self.refuse(_child(path, "pattern"), why)
            )
            return self.add(path.rsplit(".", 1)[-1] + "-pattern", f'"\\"" ({inner}) "\\"" {space}')
        if lo is None and hi is None:
            return self.prim("string")
        lo = lo or 0
        if hi is not None and hi < lo:
            raise self.refuse(_child(path, "maxLength"), f"maxLength {hi} is below minLength {lo}")
        chars = repeat(self.prim("char1"), lo, hi, self.limits.max_repeat)
        return self.add(f"string-{lo}-{hi}", f'"\\"" {chars} "\\"" {space}')

    def count(self, schema: dict[str, Any], key: str, path: str, most: int | None = None) -> int | None:
        """A non-negative whole ``schema[key]`` up to ``most`` (the grammar's repetition cap by default)."""
        value = schema.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != int(value):
            raise self.refuse(_child(path, key), f"{key} must be a non-negative integer, not {value!r}")
        most = self.limits.max_repeat if most is None else most
        if value > most:
            raise self.refuse(
                _child(path, key),
                f"{key} {int(value)} is over the limit of {most}",
                f"drop {key} or keep it at or under {most}",
            )
        return int(value)

    def number(self, schema: dict[str, Any], path: str, integer: bool) -> str:
        lo, lo_x, hi, hi_x = self.bounds(schema, path)
        digits = FRACTION_DIGITS
        step = schema.get("multipleOf")
        if step is not None:
            integer, digits = self.multiple_of(step, path, integer)
        space = self.prim("space")
        if integer:
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
            if ilo is None and ihi is None:
                return self.prim("integer")
            if ilo is not None and ihi is not None and ilo > ihi:
                raise self.refuse(path, f"no integer lies between the bounds {lo} and {hi}")
            return self.add(f"integer-{ilo}-{ihi}", f"{int_range(ilo, ihi)} {space}")
        if lo is None and hi is None and step is None:
            return self.prim("number")
        for key, value in (("minimum", lo), ("maximum", hi)):
            if value is not None and value != int(value):
                raise self.refuse(
                    _child(path, key), f"a number bound must be a whole number for a grammar, not {value}"
                )
        body = number_range(None if lo is None else int(lo), lo_x, None if hi is None else int(hi), hi_x, digits)
        if body is None:
            raise self.refuse(path, f"no number lies between the bounds {lo} and {hi}")
        return self.add(f"number-{lo}-{hi}", f"{body} {space}")

    def bounds(self, schema: dict[str, Any], path: str) -> tuple[float | None, bool, float | None, bool]:
        """(lower, exclusive, upper, exclusive), draft 4's boolean exclusives and 6+'s numbers alike."""
        out: list[Any] = []
        for plain, excl in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            bound, flag = schema.get(plain), schema.get(excl)
            for key, value in ((plain, bound), (excl, flag)):
                if value is not None and not isinstance(value, bool) and not isinstance(value, int | float):
                    raise self.refuse(_child(path, key), f"{key} must be a number")
                if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > _MAX_BOUND:
                    raise self.refuse(_child(path, key), f"{key} {value} is beyond ±10^18, too large for a grammar")
            exclusive = False
            if isinstance(flag, bool):
                exclusive = flag and bound is not None
            elif flag is not None:
                tighter = plain == "minimum" and (bound is None or flag >= bound)
                tighter = tighter or (plain == "maximum" and (bound is None or flag <= bound))
                bound, exclusive = (flag, True) if tighter else (bound, False)
            out += [bound, exclusive]
        return out[0], out[1], out[2], out[3]

    def multiple_of(self, step: Any, path: str, integer: bool) -> tuple[bool, int]:
        """(integer only?, fraction digits) for ``multipleOf``: 1 (whole numbers) and 10^-d are
        what a digit grammar can say; any other step is refused."""
        where = _child(path, "multipleOf")
        if isinstance(step, bool) or not isinstance(step, int | float) or step <= 0:
            raise self.refuse(where, "multipleOf must be a positive number")
        exact = Decimal(str(step)).normalize()
        if exact == 1:
            return True, FRACTION_DIGITS
        sign, digits, exponent = exact.as_tuple()
        if digits == (1,) and isinstance(exponent, int) and -FRACTION_DIGITS <= exponent < 0:
            return integer, -exponent
        raise self.refuse(where, f"multipleOf {step} is not supported (only 1 and powers of ten below it: 0.1, 0.01…)")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), "value")
