"""The one door for schemas and grammars: compiled and checked where a failure costs a 400,
never first in a worker, where it could cost the process.

:func:`schema_gbnf` compiles a JSON Schema with localrun's converter
(:mod:`localrun.chat.schema_grammar`) and reads the result back with the GBNF checker
(:mod:`localrun.chat.gbnf`); grammars are cached by the schema's JSON text (an LRU of
:data:`CACHE_ENTRIES`), so a client that sends the same 200 tools on every turn pays once.
:func:`check_request` runs every schema and grammar of a request through it — the response
format, each tool's parameters, a raw ``grammar`` — naming each by the client's own path
(:class:`ConstraintNames`: ``tools[3].function.parameters`` on OpenAI,
``tools[3].input_schema`` on Anthropic…). The server calls it before the manager opens a
stream; the llama.cpp worker compiles through the same functions, so what was checked is
what runs.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from localrun.chat.gbnf import check_gbnf, clear_parsed_lines
from localrun.chat.schema_grammar import DEFAULT_SCHEMA_LIMITS, SchemaGrammar, SchemaLimits
from localrun.errors import UnsupportedFeature
from localrun.types import ChatRequest, CompletionRequest

log = logging.getLogger(__name__)

CACHE_ENTRIES = 1024
#: A schema's JSON text over this is refused before it is compiled.
MAX_SCHEMA_BYTES = 2_000_000
#: JSON nesting (objects and arrays) of one schema, checked before anything recurses over it;
#: the converter's own limit (64 schema levels) is usually met first.
MAX_JSON_DEPTH = 256

_cache: OrderedDict[tuple[str, str, str, tuple[str, ...]], str] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True)
class ConstraintNames:
    """How a wire family names the places a schema or grammar comes in (``{i}``: the tool's index)."""

    schema: str = "response_format.json_schema.schema"
    tool: str = "tools[{i}].function.parameters"
    grammar: str = "grammar"


OPENAI = ConstraintNames()
OLLAMA = ConstraintNames(schema="format")
ANTHROPIC = ConstraintNames(schema="output_config.format.schema", tool="tools[{i}].input_schema")
RESPONSES = ConstraintNames(schema="text.format.schema", tool="tools[{i}].parameters")
LLAMA_SERVER = ConstraintNames(schema="json_schema")


def json_depth(value: Any, stop: int) -> int:
    """How deep ``value`` nests (objects and arrays), counted without recursion; stops past ``stop``."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if deepest > stop:
                return deepest
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def schema_gbnf(
    schema: Any,
    *,
    param: str = "response_format",
    root: str = "root",
    prop_order: tuple[str, ...] = (),
    limits: SchemaLimits = DEFAULT_SCHEMA_LIMITS,
) -> str:
    """A checked GBNF grammar whose rule ``root`` matches JSON text valid against ``schema``.

    Raises:
        UnsupportedFeature: a keyword the grammar cannot enforce, a limit passed, or a grammar
            that would match nothing; the message and ``param`` name the schema path.
    """
    if not isinstance(schema, dict | bool):
        raise UnsupportedFeature(
            f"{param}: the JSON schema must be an object, not {type(schema).__name__}",
            param=param,
            hint="send a JSON Schema object",
        )
    depth = json_depth(schema, MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        raise UnsupportedFeature(
            f"{param}: the schema nests deeper than {MAX_JSON_DEPTH} JSON levels",
            param=param,
            hint="flatten the schema",
        )
    text = json.dumps(schema, ensure_ascii=False)
    if len(text) > MAX_SCHEMA_BYTES:
        raise UnsupportedFeature(
            f"{param}: the schema is {len(text)} bytes; the limit is {MAX_SCHEMA_BYTES}",
            param=param,
            hint="send a smaller schema",
        )
    key = (text, param, root, prop_order)
    with _lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
            return found
    builder = SchemaGrammar(schema, path=param, limits=limits, prop_order=prop_order)
    top = builder.visit(schema, param, 0)
    gbnf = builder.grammar(root, top)
    if '"$ref"' in text:  # only a reference can close a loop; other grammars are sound by construction (fuzzed)
        check_gbnf(gbnf if root == "root" else f"root ::= {root}\n{gbnf}", param=param, one_rule_a_line=True)
    with _lock:
        _cache[key] = gbnf
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)
    return gbnf


def cache_clear() -> None:
    """Forget every compiled grammar (and the checker's parsed lines): for measurements and tests."""
    with _lock:
        _cache.clear()
    clear_parsed_lines()


def tool_parameters(tool: Any) -> Any:
    """A tool definition's parameters schema (OpenAI's shape, as ``ChatRequest.tools`` holds them)."""
    fn = tool.get("function") if isinstance(tool, dict) else None
    params = (fn or {}).get("parameters") if isinstance(fn, dict) else None
    return {"type": "object"} if params is None else params


def check_request(req: ChatRequest | CompletionRequest, names: ConstraintNames = OPENAI) -> None:
    """Compile every schema and check every grammar ``req`` carries (cached), or raise the 400.

    Raises:
        UnsupportedFeature: naming the first part that cannot be enforced or is over a limit.
    """
    sampling = req.sampling
    if sampling.json_schema is not None:
        schema_gbnf(sampling.json_schema or {"type": "object"}, param=names.schema)
    if sampling.grammar is not None:
        check_gbnf(sampling.grammar, param=names.grammar)
    if isinstance(req, ChatRequest) and req.tools and req.tool_choice != "none":
        for i, tool in enumerate(req.tools):
            schema_gbnf(tool_parameters(tool), param=names.tool.format(i=i))
