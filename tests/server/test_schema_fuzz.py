"""Hypothesis fuzz of the schema converter and the GBNF checker, with llama.cpp's grammar engine
(SmolLM2's vocabulary, in this process) as the judge: every schema either is refused with a
400 naming a path, or compiles to a grammar the checker accepts and llama.cpp parses and can
step through; every GBNF text either is refused with a 400, or llama.cpp parses it and samples
through it without dying (a crash here would kill the test run). Bounded examples in CI; the
long run (``-m long``) tries ten times as many."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localrun.chat.constraints import schema_gbnf
from localrun.chat.gbnf import check_gbnf
from localrun.errors import UnsupportedFeature
from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

COUNTS = st.one_of(st.integers(0, 5), st.sampled_from([0, 1, 2000, 2001, 100000, 10**9]))
BOUNDS = st.one_of(st.integers(-1000, 1000), st.sampled_from([0, 1, -1, 10**18, 10**19, 0.5, 2.0]))
PATTERNS = st.sampled_from(
    [
        "^a+$",
        "[0-9]{2}",
        "^(x|y)*z$",
        "\\d\\w\\s.",
        "(?=a)",
        "\\1",
        "[z-a]",
        "a{3000}",
        "(a?)*",
        "[^\\s\\S]",
        "(((",
        "^[\\^a-]+$",
        "[]^-]",
    ]
)
FORMATS = st.sampled_from(
    ["date", "time", "date-time", "uuid", "email", "ipv4", "uri", "hostname", "duration", "regex"]
)


def _maybe(key: str, values: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.just({}), values.map(lambda v: {key: v}))


def _merge(parts: list[dict]) -> dict:
    out: dict = {}
    for p in parts:
        out.update(p)
    return out


LEAF = st.one_of(
    st.tuples(
        st.just({"type": "integer"}),
        _maybe("minimum", BOUNDS),
        _maybe("maximum", BOUNDS),
        _maybe("exclusiveMinimum", BOUNDS),
        _maybe("multipleOf", st.sampled_from([1, 2, 0.1, 0.01])),
    )
    .map(list)
    .map(_merge),
    st.tuples(st.just({"type": "number"}), _maybe("minimum", BOUNDS), _maybe("exclusiveMaximum", BOUNDS))
    .map(list)
    .map(_merge),
    st.tuples(st.just({"type": "string"}), _maybe("minLength", COUNTS), _maybe("maxLength", COUNTS))
    .map(list)
    .map(_merge),
    st.builds(lambda p: {"type": "string", "pattern": p}, PATTERNS),
    st.builds(lambda f: {"type": "string", "format": f}, FORMATS),
    st.sampled_from(
        [{"type": "boolean"}, {"type": "null"}, {}, True, {"enum": ["a", 1, None]}, {"const": [1]}, {"type": "strin"}]
    ),
    st.sampled_from(
        [
            {"$ref": "#/$defs/d"},
            {"$ref": "#"},
            {"$ref": "#/nowhere"},
            {"not": {}},
            {"uniqueItems": True, "type": "array"},
        ]
    ),
)
NAMES = st.text(alphabet='ab"\\\n é^]-[', min_size=0, max_size=4)


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    props = st.dictionaries(NAMES, children, max_size=4)
    return st.one_of(
        st.builds(
            lambda p, req, extra: {"type": "object", "properties": p, "required": [k for k in p if k in req], **extra},
            props,
            st.sets(NAMES, max_size=3),
            _maybe("additionalProperties", st.one_of(st.booleans(), children)),
        ),
        st.tuples(
            st.builds(lambda c: {"type": "array", "items": c}, children),
            _maybe("minItems", COUNTS),
            _maybe("maxItems", COUNTS),
        )
        .map(list)
        .map(_merge),
        st.builds(lambda cs: {"anyOf": cs}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda cs: {"allOf": cs}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda c: {"type": "array", "prefixItems": [c, c]}, children),
    )


SCHEMAS = st.builds(
    lambda body, d: {**body, "$defs": {"d": d}} if isinstance(body, dict) else body,
    st.recursive(LEAF, _extend, max_leaves=12),
    st.recursive(LEAF, _extend, max_leaves=4),
)

GBNF_PIECES = st.sampled_from(
    [
        '"a"',
        '"\\n"',
        "[a-z]",
        "[z-a]",
        "[^a]",
        "[]",
        "[^\\x00-\\U0010FFFF]",
        "(",
        ")",
        "|",
        "*",
        "+",
        "?",
        "{2,3}",
        "{0,}",
        "{5000}",
        " x",
        " root",
        " y",
        "\nx ::= ",
        "\ny ::= ",
        "\nroot ::= ",
        " .",
        " #c\n",
        " <[12]>",
        '""',
        "\\",
        ' ("b" x)',
        "-",
    ]
)
SOUP = st.lists(GBNF_PIECES, max_size=25).map(lambda parts: "root ::= " + " ".join(parts))
ATOMS = st.sampled_from(['"a"', '"bc"', "[a-c]", "[^a]", ".", "x", "y", "root", '""', "[z-a]", '"\\n"', "[0-9]"])
QUANTS = st.sampled_from(["", "", "*", "+", "?", "{2}", "{0,3}", "{1,}", "{2001}"])
EXPRS = st.recursive(
    ATOMS,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=4).map(" ".join),
        st.lists(inner, min_size=2, max_size=3).map(" | ".join),
        st.tuples(inner, QUANTS).map(lambda t: f"({t[0]}){t[1]}"),
    ),
    max_leaves=10,
)
STRUCTURED = st.tuples(EXPRS, EXPRS, EXPRS).map(lambda e: f"root ::= {e[0]}\nx ::= {e[1]}\ny ::= {e[2]}\n")
GRAMMARS = st.one_of(SOUP, STRUCTURED)


@pytest.fixture(scope="module")
def matcher(smollm2_path):
    from tests.support.grammar_match import GrammarMatcher

    m = GrammarMatcher(smollm2_path)
    yield m
    m.close()


def _schema_case(matcher, schema) -> None:
    try:
        gbnf = schema_gbnf(schema, param="p")
    except UnsupportedFeature as exc:
        assert exc.http_status == 400 and exc.param and exc.param.startswith("p"), exc
        return
    check_gbnf(gbnf)  # the converter's output passes the checker even where it is not run (no $ref)
    assert matcher.parses(gbnf), gbnf
    matcher.matches(gbnf, json.dumps(None))  # steps through without dying; the answer does not matter


def _grammar_case(matcher, text: str) -> None:
    try:
        check_gbnf(text)
    except UnsupportedFeature as exc:
        assert exc.http_status == 400 and exc.param == "grammar"
        return
    assert matcher.parses(text), text
    for probe in ("a", "ab\n", "zzz", ""):
        matcher.matches(text, probe)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
LONG = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(schema=SCHEMAS)
def test_schema_fuzz(matcher, schema):
    _schema_case(matcher, schema)


@FUZZ
@given(text=GRAMMARS)
def test_gbnf_fuzz(matcher, text):
    _grammar_case(matcher, text)


@pytest.mark.long
@LONG
@given(schema=SCHEMAS)
def test_schema_fuzz_long(matcher, schema):
    _schema_case(matcher, schema)


@pytest.mark.long
@LONG
@given(text=GRAMMARS)
def test_gbnf_fuzz_long(matcher, text):
    _grammar_case(matcher, text)
