"""Each schema or grammar that used to kill the llama.cpp worker (held-out probe of issue 34:
``maxItems: 100000`` → SIGSEGV, 20k nested ``(`` → SIGSEGV, ``root ::= [z-a]`` → SIGABRT, a
schema nested 300 objects deep → 500 RecursionError), sent to a real server on SmolLM2 through
every form a schema or grammar comes in: each a 400 naming the part and the limit, and the
worker's pid the same afterwards (it was never reached), and it still answers."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import needs_llama
from tests.support.servers import health

pytestmark = [needs_llama, pytest.mark.llama]


def _deep(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


WIDE = {"type": "array", "items": {"type": "string"}, "maxItems": 100000}
HUGE = {"type": "array", "items": {"type": "string"}, "maxItems": 10**9}
SCHEMAS = {
    "maxItems 100000": (WIDE, "maxItems"),
    "maxItems 1e9": (HUGE, "maxItems"),
    "300 deep": (_deep(300), "deeper"),
}
GRAMMARS = {
    "20k nested (": ("root ::= " + "(" * 20000 + '"a"' + ")" * 20000, "deeper than 64"),
    "[z-a]": ("root ::= [z-a]", "inverted"),
    "left recursion": ('root ::= root "a" | "b"', "left-recursive"),
    "never completes": ('root ::= "a" root', "matches nothing"),
}


def _schema_bodies(schema: dict) -> dict[str, tuple[str, dict]]:
    """Every form a schema enters by: (path, body)."""
    msgs = [{"role": "user", "content": "hi"}]
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": schema}}},
    }
    return {
        "openai response_format": (
            "/v1/chat/completions",
            {
                "model": "smol",
                "messages": msgs,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            },
        ),
        "openai tools auto": ("/v1/chat/completions", {"model": "smol", "messages": msgs, "tools": [tool]}),
        "openai tools required": (
            "/v1/chat/completions",
            {"model": "smol", "messages": msgs, "tools": [tool], "tool_choice": "required"},
        ),
        "openai completions json_schema": ("/v1/completions", {"model": "smol", "prompt": "hi", "json_schema": schema}),
        "ollama format": ("/api/chat", {"model": "smol", "messages": msgs, "format": schema, "stream": False}),
        "ollama generate format": (
            "/api/generate",
            {"model": "smol", "prompt": "hi", "format": schema, "stream": False},
        ),
        "anthropic tools": (
            "/v1/messages",
            {
                "model": "smol",
                "max_tokens": 8,
                "messages": msgs,
                "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"x": schema}}}],
            },
        ),
        "responses text.format": (
            "/v1/responses",
            {
                "model": "smol",
                "input": "hi",
                "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
            },
        ),
        "responses tools": (
            "/v1/responses",
            {
                "model": "smol",
                "input": "hi",
                "tools": [
                    {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"x": schema}}}
                ],
            },
        ),
        "llama-server completion": (
            "/completion",
            {"model": "smol", "prompt": "hi", "json_schema": schema, "n_predict": 4},
        ),
    }


def _grammar_bodies(grammar: str) -> dict[str, tuple[str, dict]]:
    msgs = [{"role": "user", "content": "hi"}]
    return {
        "openai chat grammar": ("/v1/chat/completions", {"model": "smol", "messages": msgs, "grammar": grammar}),
        "openai completions grammar": ("/v1/completions", {"model": "smol", "prompt": "hi", "grammar": grammar}),
        "llama-server completion grammar": (
            "/completion",
            {"model": "smol", "prompt": "hi", "grammar": grammar, "n_predict": 4},
        ),
    }


#: Where each form says the 100,000-item array is: the client's own path to the keyword.
WIDE_PATHS = {
    "openai response_format": "response_format.json_schema.schema.maxItems",
    "openai tools auto": "tools[0].function.parameters.properties.x.maxItems",
    "openai completions json_schema": "json_schema.maxItems",
    "ollama format": "format.maxItems",
    "anthropic tools": "tools[0].input_schema.properties.x.maxItems",
    "responses text.format": "text.format.schema.maxItems",
    "responses tools": "tools[0].parameters.properties.x.maxItems",
    "llama-server completion": "json_schema.maxItems",
}


def _message(r: httpx.Response) -> str:
    body = r.json()
    err = body.get("error")
    return (err.get("message") if isinstance(err, dict) else err) or str(body)


def test_no_schema_or_grammar_reaches_the_worker_to_kill_it(serve, smollm2_path):
    server = serve(smollm2_path, "smol", runtime="", plan={"n_threads": 1, "n_ctx": 512})
    first = httpx.post(
        f"{server.url}/v1/completions", json={"model": "smol", "prompt": "hi", "max_tokens": 2}, timeout=120
    )
    assert first.status_code == 200, first.text
    pid = health(server.url)["models"][0]["pid"]
    sent = 0
    for name, (schema, words) in SCHEMAS.items():
        for form, (path, body) in _schema_bodies(schema).items():
            r = httpx.post(f"{server.url}{path}", json=body, timeout=60)
            assert r.status_code == 400, (name, form, r.status_code, r.text[:300])
            assert words in _message(r), (name, form, _message(r)[:300])
            if schema is WIDE and form in WIDE_PATHS:
                assert _message(r).startswith(WIDE_PATHS[form]), (form, _message(r)[:200])
            sent += 1
    for name, (grammar, words) in GRAMMARS.items():
        for form, (path, body) in _grammar_bodies(grammar).items():
            r = httpx.post(f"{server.url}{path}", json=body, timeout=60)
            assert r.status_code == 400, (name, form, r.status_code, r.text[:300])
            assert words in _message(r), (name, form, _message(r)[:300])
            sent += 1
    after = health(server.url)
    assert after["models"][0]["pid"] == pid and after.get("worker_restarts", 0) == 0, (sent, after)
    again = httpx.post(
        f"{server.url}/v1/completions", json={"model": "smol", "prompt": "hi", "max_tokens": 2}, timeout=120
    )
    assert again.status_code == 200, again.text
