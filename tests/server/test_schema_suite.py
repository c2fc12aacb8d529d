"""The JSON Schema converter, keyword by keyword: instances that must match and instances that
must not, each checked against the schema itself (jsonschema) and through llama.cpp's own
grammar engine (``tests.support.grammar_match``, SmolLM2's vocabulary); what SmolLM2 writes
under each grammar at temperature 1.0 validates; every keyword a grammar cannot enforce is a
400 naming it and its path; and 200 tools compile in bounded time and memory."""

from __future__ import annotations

import json
import time
import tracemalloc

import jsonschema
import pytest

from localrun.chat.constraints import ANTHROPIC, cache_clear, check_request, schema_gbnf
from localrun.errors import UnsupportedFeature
from localrun.types import ChatRequest, Message, Sampling
from tests.conftest import needs_llama

INT_1_7 = {"type": "integer", "minimum": 1, "maximum": 7}
#: (name, schema, instances that must match, instances that must not); every "good" is valid and
#: written in the grammar's property order, every "bad" is invalid against the schema.
CASES = [
    ("integer bounds", INT_1_7, [1, 4, 7], [0, 8, 365, -1, 1.5, "3"]),
    (
        "integer wide bounds",
        {"type": "integer", "minimum": -120, "maximum": 3456},
        [-120, -7, 0, 99, 3456],
        [-121, 3457, 10000],
    ),
    ("exclusive bounds", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, [1, 9], [0, 10]),
    ("draft 4 exclusive", {"type": "integer", "minimum": 5, "exclusiveMinimum": True}, [6, 60], [5, 4]),
    ("lower bound only", {"type": "integer", "minimum": 18}, [18, 19, 100, 12345], [17, 0, -18, 9]),
    ("upper bound only", {"type": "integer", "maximum": -3}, [-3, -4, -100], [-2, 0, 3]),
    ("number bounds", {"type": "number", "minimum": 0, "maximum": 1}, [0, 0.5, 1, 0.25], [1.5, -0.1, 2]),
    ("number exclusive", {"type": "number", "exclusiveMinimum": 0, "maximum": 2}, [0.01, 2, 1.5], [0, -1, 2.5]),
    ("negative number range", {"type": "number", "minimum": -90, "maximum": 90}, [-90, -45.5, 0, 89.9], [-91, 90.5]),
    ("multipleOf 0.01", {"type": "number", "multipleOf": 0.01}, [1.25, 3, -0.5], [1.255]),
    ("multipleOf 1", {"type": "number", "multipleOf": 1, "minimum": 0}, [0, 3], [2.5, -1]),
    ("string lengths", {"type": "string", "minLength": 2, "maxLength": 4}, ["ab", "abcd", 'a"c'], ["a", "abcde", ""]),
    # Over llama.cpp's repetition cap of 2,000, a length is written as counted blocks (Claude Code's
    # Workflow tool says maxLength 524288).
    ("long string bound", {"type": "string", "maxLength": 2500}, ["", "a" * 2500], ["a" * 2501]),
    (
        "long string range",
        {"type": "string", "minLength": 2003, "maxLength": 4100},
        ["a" * 2003, "a" * 3001, "a" * 4100],
        ["a" * 2002, "a" * 4101, ""],
    ),
    (
        "property names: any string",  # zod's record, in Claude Code's task tools
        {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "string"}},
        [{}, {"k": "v"}],
        [{"k": 1}],
    ),
    (
        "property names of declared properties",
        {
            "type": "object",
            "properties": {"ab": {"type": "integer"}},
            "propertyNames": {"maxLength": 3},
            "additionalProperties": False,
        },
        [{"ab": 1}, {}],
        [{"ab": "x"}, {"abcd": 1}],
    ),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"}, ["AB-123"], ["ab-123", "AB-1234", "AB123"]),
    ("unanchored pattern", {"type": "string", "pattern": "cat"}, ["cat", "a cat!"], ["dog"]),
    ("pattern alternation", {"type": "string", "pattern": "^(yes|no)$"}, ["yes", "no"], ["maybe", "yesno"]),
    ("format date", {"type": "string", "format": "date"}, ["2024-02-28", "1999-12-31"], ["2024-13-01", "24-1-1", "x"]),
    ("format time", {"type": "string", "format": "time"}, ["23:59:59Z", "08:00:00+02:00"], ["24:00:00Z", "8:00"]),
    ("format date-time", {"type": "string", "format": "date-time"}, ["2024-05-01T10:00:00Z"], ["2024-05-01 10:00"]),
    ("format uuid", {"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567"]),
    ("format email", {"type": "string", "format": "email"}, ["a.b@example.com"], ["not an email"]),
    ("format ipv4", {"type": "string", "format": "ipv4"}, ["192.168.0.1"], ["256.1.1.1", "1.2.3"]),
    ("enum", {"enum": ["red", "green", 3, None]}, ["red", 3, None], ["blue", 4]),
    ("const", {"const": {"a": 1}}, [{"a": 1}], [{"a": 2}, 1]),
    (
        "array bounds",
        {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
        [[True, False], [True, True, True]],
        [[True], [True] * 4, [1, 2]],
    ),
    (
        "tuple",
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
        [[1, "a"]],
        [["a", 1], [1, "a", 2]],
    ),
    (
        "object required and order",
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["b"]},
        [{"b": "x"}, {"b": "x", "a": 1}],
        [{"a": 1}, {"b": 1}, {}],
    ),
    (
        "additionalProperties schema",
        {"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
        [{}, {"id": 1, "x": "y"}, {"zz": "y"}],
        [{"x": 1}, {"id": "no"}],
    ),
    (
        "additionalProperties false",
        {"type": "object", "properties": {"a": {"type": "null"}}, "additionalProperties": False},
        [{}, {"a": None}],
        [{"b": 1}],
    ),
    (
        "anyOf",
        {"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string", "maxLength": 1}]},
        [10, "a"],
        [9, "ab"],
    ),
    ("oneOf disjoint", {"oneOf": [{"type": "boolean"}, {"type": "null"}]}, [True, None], [0]),
    (
        "allOf",
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "boolean"}}, "required": ["b"]},
            ]
        },
        [{"a": 1, "b": True}],
        [{"a": 1}, {"b": True}],
    ),
    ("type list", {"type": ["integer", "null"], "maximum": 3}, [3, None], [4, "x"]),
    ("nullable", {"type": "string", "nullable": True, "maxLength": 2}, ["ab", None], ["abc"]),
    (
        "recursive $ref",
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "v": {"type": "integer"},
                        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
                    },
                    "required": ["v", "next"],
                }
            },
            "$ref": "#/$defs/node",
        },
        [{"v": 1, "next": None}, {"v": 1, "next": {"v": 2, "next": None}}],
        [{"v": 1, "next": {"v": "x", "next": None}}],
    ),
]


#: jsonschema's own checkers for these; its time and date-time need an extra package.
FORMAT_CHECKER = jsonschema.FormatChecker(formats=("date", "uuid", "ipv4", "email"))


def _text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize(("name", "schema", "good", "bad"), CASES, ids=[c[0] for c in CASES])
def test_case_data_is_right_about_the_schema(name, schema, good, bad):
    check = jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER)
    for value in good:
        assert check.is_valid(value) or name == "nullable", (name, value)  # an OpenAPI keyword, unknown to jsonschema
    for value in bad:
        if name in ("draft 4 exclusive", "nullable") or schema.get("format") in ("time", "date-time"):
            continue  # 2020-12 reads exclusiveMinimum: true as a number; no checker here for times
        assert not check.is_valid(value), (name, value)


@pytest.fixture(scope="module")
def matcher(smollm2_path):
    from tests.support.grammar_match import GrammarMatcher

    m = GrammarMatcher(smollm2_path)
    yield m
    m.close()


@pytest.fixture(scope="module")
def writer(smollm2_path):
    from tests.support.grammar_match import GrammarMatcher

    m = GrammarMatcher(smollm2_path, load_weights=True)
    yield m
    m.close()


@needs_llama
@pytest.mark.llama
@pytest.mark.parametrize(("name", "schema", "good", "bad"), CASES, ids=[c[0] for c in CASES])
def test_each_keyword_through_llama_cpps_grammar_engine(matcher, name, schema, good, bad):
    gbnf = schema_gbnf(schema)
    assert matcher.parses(gbnf)
    for value in good:
        assert matcher.matches(gbnf, _text(value)), (name, _text(value), gbnf)
    for value in bad:
        assert not matcher.matches(gbnf, _text(value)), (name, _text(value), gbnf)


@needs_llama
@pytest.mark.llama
@pytest.mark.long  # 35 generations of up to 64 tokens: minutes on a shared 2-core machine
def test_what_smollm2_writes_under_each_grammar_validates(writer):
    """Temperature 1.0, no top-k: the model wanders, the grammar keeps it valid."""
    for n, (name, schema, _, _) in enumerate(CASES):
        text, done = writer.sample(schema_gbnf(schema), "JSON: ", temperature=1.0, seed=n, max_tokens=64)
        if not done:
            continue  # out of tokens mid-value (a long string): nothing to validate yet
        check = jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER)
        if name != "draft 4 exclusive":
            assert check.is_valid(json.loads(text)), (name, text)


#: (schema, the path the 400 names); each a keyword or limit a grammar cannot keep.
REFUSED = [
    ({"type": "array", "uniqueItems": True}, "p.uniqueItems"),
    ({"type": "array", "items": {"type": "string"}, "maxItems": 100000}, "p.maxItems"),
    ({"type": "array", "minItems": 10**9}, "p.minItems"),
    ({"type": "string", "maxLength": 5_000_000}, "p.maxLength"),
    ({"type": "object", "propertyNames": {"maxLength": 2}}, "p.propertyNames"),
    (
        {"type": "object", "properties": {"abc": {}}, "propertyNames": {"maxLength": 2}, "additionalProperties": False},
        "p.propertyNames",
    ),
    ({"type": "string", "format": "duration"}, "p.format"),
    ({"type": "string", "pattern": "^(a)\\1$"}, "p.pattern"),
    ({"type": "string", "pattern": "^(?=a)"}, "p.pattern"),
    ({"type": "string", "pattern": "\\bword"}, "p.pattern"),
    ({"type": "string", "pattern": "a{5000}"}, "p.pattern"),
    ({"type": "integer", "multipleOf": 3}, "p.multipleOf"),
    ({"type": "number", "minimum": 0.5}, "p.minimum"),
    ({"not": {"type": "string"}}, "p.not"),
    ({"if": {}, "then": {}}, "p.if"),
    ({"type": "array", "contains": {"type": "integer"}}, "p.contains"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "p.patternProperties"),
    ({"type": "object", "minProperties": 2}, "p.minProperties"),
    ({"$ref": "https://example.com/s.json"}, "p.$ref"),
    ({"$ref": "#/$defs/missing"}, "p.$ref"),
    ({"type": "strin"}, "p.type"),
    ({"type": "string", "foo": 1}, "p.foo"),
    ({"type": "object", "properties": {"when": {"type": "string", "format": "duration"}}}, "p.properties.when.format"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "p"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "p.allOf[1].type"),
    (False, "p"),
]


@pytest.mark.parametrize(("schema", "where"), REFUSED, ids=[w + str(i) for i, (_, w) in enumerate(REFUSED)])
def test_what_a_grammar_cannot_keep_is_a_400_naming_its_path(schema, where):
    with pytest.raises(UnsupportedFeature) as caught:
        schema_gbnf(schema, param="p")
    assert caught.value.param == where and caught.value.http_status == 400
    assert caught.value.message.startswith(where), caught.value.message


def test_nesting_deeper_than_the_limit_is_a_400_not_a_recursion_error():
    deep: dict = {"type": "string"}
    for _ in range(100):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(UnsupportedFeature, match="nests deeper than 64"):
        schema_gbnf(deep, param="response_format")
    for _ in range(3000):  # deeper than json.dumps can recurse: measured without recursion first
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(UnsupportedFeature, match="deeper than 256 JSON levels"):
        schema_gbnf(deep, param="response_format")


def test_annotations_are_ignored_and_vendor_extensions_too():
    plain = schema_gbnf({"type": "integer"})
    annotated = {"type": "integer", "title": "n", "description": "d", "default": 1, "examples": [1], "x-ui": {}}
    assert schema_gbnf(annotated) == plain


def test_tool_paths_are_named_the_way_each_family_sends_them():
    tools = tuple(
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object", "properties": {}}}}
        for i in range(3)
    ) + (
        {
            "type": "function",
            "function": {
                "name": "bad",
                "parameters": {"type": "object", "properties": {"when": {"type": "string", "format": "duration"}}},
            },
        },
    )
    req = ChatRequest(messages=(Message("user", "hi"),), tools=tools, tool_choice="auto")
    with pytest.raises(UnsupportedFeature) as caught:
        check_request(req)
    assert caught.value.param == "tools[3].function.parameters.properties.when.format"
    with pytest.raises(UnsupportedFeature) as caught:
        check_request(req, ANTHROPIC)
    assert caught.value.param == "tools[3].input_schema.properties.when.format"
    check_request(ChatRequest(messages=(Message("user", "hi"),), tools=tools, tool_choice="none"))
    with pytest.raises(UnsupportedFeature, match="inverted"):
        check_request(ChatRequest(messages=(), sampling=Sampling(grammar="root ::= [z-a]")))


def _tool(i: int) -> dict:
    """A realistic tool of ~2.5 KB: nested objects, enums, bounds, formats, arrays, a $ref."""
    props = {f"field_{j}": {"type": "string", "description": "x" * 100, "maxLength": 64} for j in range(12)} | {
        "mode": {"enum": ["fast", "slow", "auto"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 500},
        "when": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
        "where": {"$ref": "#/$defs/place"},
    }
    return {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "parameters": {
                "type": "object",
                "properties": props,
                "required": ["mode", "count"],
                "$defs": {
                    "place": {
                        "type": "object",
                        "properties": {
                            "lat": {"type": "number", "minimum": -90, "maximum": 90},
                            "lon": {"type": "number", "minimum": -180, "maximum": 180},
                        },
                        "required": ["lat", "lon"],
                    }
                },
            },
        },
    }


def test_200_tools_compile_in_bounded_time_and_memory():
    tools = tuple(_tool(i) for i in range(200))
    size = len(json.dumps(tools))
    req = ChatRequest(messages=(Message("user", "hi"),), tools=tools, tool_choice="auto")
    cache_clear()
    start = time.perf_counter()
    check_request(req)
    cold = time.perf_counter() - start
    cache_clear()
    tracemalloc.start()  # a second cold compile, measured for memory (tracemalloc slows it down)
    check_request(req)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    start = time.perf_counter()
    check_request(req)
    warm = time.perf_counter() - start
    print(
        f"200 tools, {size / 1000:.0f} KB of schemas: cold {cold:.2f} s, peak {peak / 1e6:.1f} MB, "
        f"cached {warm * 1000:.1f} ms"
    )
    assert size > 500_000
    assert cold < 20 and peak < 50e6 and warm < 0.5
