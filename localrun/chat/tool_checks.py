"""Tool calls checked against their function's schema after the fact, for every runtime.

llama.cpp holds a call valid with a grammar while it is written; Ollama, MLX, MLC and the
upstreams parse a call after the model wrote it, and a small model's call can break its
schema (a string where an integer goes, a missing required argument, an enum it made up). Such
a call must not reach the app as if it were valid: :func:`check_tool_calls` raises
:class:`~localrun.errors.InvalidModelOutput`, which every API answers in its own error shape
(500, as OpenAI answers "the model produced invalid content", so a client may simply retry,
and each try samples anew). A retry inside the server was not chosen: only llama.cpp could
hold a retry to a grammar, and there the call is already valid by grammar.

The same check covers a keyword a grammar does not carry (llama.cpp's converter leaves some
bounds to the model): a call breaking it is refused, not returned.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from localrun.errors import InvalidModelOutput

__all__ = ["call_problems", "check_tool_calls"]

log = logging.getLogger(__name__)


def _schemas(tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = fn.get("parameters") or {"type": "object"}
    return out


def call_problems(calls: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[str]:
    """What is wrong with each call, in words (empty when every call validates)."""
    import jsonschema

    schemas = _schemas(tools)
    problems: list[str] = []
    for i, call in enumerate(calls):
        fn = call.get("function") or {}
        name, raw = fn.get("name"), fn.get("arguments", "{}")
        if name not in schemas:
            problems.append(f"call {i} names {name!r}, which is not among the request's tools")
            continue
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as exc:
            problems.append(f"call {i} to {name!r}: its arguments are not JSON ({exc})")
            continue
        try:
            kind = jsonschema.validators.validator_for(schemas[name])
            kind.check_schema(schemas[name])  # a schema that is not JSON Schema ("properties": null) is not judged
            error = jsonschema.exceptions.best_match(kind(schemas[name]).iter_errors(args))
        except (jsonschema.exceptions.SchemaError, TypeError, ValueError, AttributeError) as exc:  # the request's own
            log.info("cannot check a call to %s: its schema is not valid JSON Schema (%s)", name, exc)
            continue
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(the arguments)"
            problems.append(f"call {i} to {name!r}: {where}: {error.message}")
    return problems


def check_tool_calls(calls: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], *, model: str) -> None:
    """Raises:
    InvalidModelOutput: a call breaks its function's schema (each problem named)."""
    problems = call_problems(calls, tools) if calls and tools else []
    if problems:
        raise InvalidModelOutput(
            f"{model} wrote a tool call that breaks its schema: " + "; ".join(problems),
            hint="retry (each try samples anew), or use a model that calls functions more reliably",
            param="tools",
        )
