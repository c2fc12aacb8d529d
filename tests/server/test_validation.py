"""One validation path for every body: a lone UTF-16 surrogate anywhere is a 400 naming where.

Python's JSON parser accepts ``"\\ud800"``; the string it makes cannot be encoded for a
tokenizer, the worker pipe or a log line, and 11 routes answered 500 (the llama.cpp worker
also leaked an entry per request). The routes are read from the app itself, so a route added
later is checked without anyone remembering to list it.
"""

from __future__ import annotations

import inspect
import json

import pytest

from localrun.server.validate import refuse_lone_surrogates
from tests.conftest import needs_llama
from tests.support.servers import health, wait_until

LONE = "a\ud800b"
#: Every write method a route may take a body on.
BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def _flat(routes, prefix: str = ""):
    """(path, methods) of every route, through the included routers of newer FastAPI versions."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _flat(inner.routes, prefix + (route.include_context.prefix or ""))
        elif getattr(route, "methods", None):
            yield prefix + route.path, set(route.methods), route.endpoint


def _reads_body(endpoint) -> bool:
    """A POST/PUT/PATCH route always may; a DELETE only where it parses one (``/api/delete``, not
    ``DELETE /v1/responses/{id}``)."""
    return "parse_body(" in inspect.getsource(endpoint)


def body_routes(app) -> list[tuple[str, str]]:
    """(method, concrete path) for every route that can take a body; path parameters filled with 'x'."""
    out = []
    for path, methods, endpoint in _flat(app.routes):
        concrete = "/".join("x" if part.startswith("{") else part for part in path.split("/"))
        for method in sorted(methods & BODY_METHODS):
            if method != "DELETE" or _reads_body(endpoint):
                out.append((method, concrete))
    return out


def _send(client, method: str, path: str, body: dict):
    # json.dumps escapes the surrogate as \ud800, as a client's JSON encoder does
    return client.request(method, path, content=json.dumps(body), headers={"content-type": "application/json"})


def test_the_route_listing_sees_every_family(app_client):
    routes = set(body_routes(app_client().app))
    for path in ("/v1/chat/completions", "/api/generate", "/v1/messages", "/v1/responses", "/completion", "/rerank"):
        assert ("POST", path) in routes
    assert ("DELETE", "/api/delete") in routes and ("DELETE", "/v1/responses/x") not in routes


def test_a_lone_surrogate_is_a_400_naming_the_field_on_every_body_route(app_client):
    client = app_client()
    bodies = {
        "messages.0.content": {"model": "tiny", "messages": [{"role": "user", "content": LONE}], "max_tokens": 2},
        "prompt": {"model": "tiny", "prompt": LONE, "max_tokens": 2},
        "input.1": {"model": "tiny", "input": ["fine", LONE]},
        "tools.0.function.y": {"model": "tiny", "tools": [{"function": {"arguments": {"x": 1}, "y": LONE}}]},
        "system": {"model": "tiny", "system": LONE},
        "?x": {"model": "tiny", "\ud800x": 1},  # a key: shown with the surrogate replaced
    }
    failures = []
    for method, path in body_routes(client.app):
        if path.startswith("/api/blobs/"):
            continue  # an upload's body is the file's bytes, not JSON (tests/server/ollama/test_ollama_blobs.py)
        for where, body in bodies.items():
            r = _send(client, method, path, body)
            ok = r.status_code == 400 and where in r.text and "surrogate" in r.text
            if not ok:
                failures.append(f"{method} {path} [{where}]: {r.status_code} {r.text[:160]}")
    assert not failures, "\n".join(failures)


def test_the_field_is_the_error_param_in_each_shape(app_client):
    client = app_client()
    body = {"model": "tiny", "messages": [{"role": "user", "content": LONE}], "max_tokens": 2}
    openai_err = _send(client, "POST", "/v1/chat/completions", body).json()["error"]
    assert openai_err["param"] == "messages.0.content" and openai_err["type"] == "invalid_request_error"
    anthropic = _send(client, "POST", "/v1/messages", body).json()
    assert anthropic["type"] == "error" and "messages.0.content" in anthropic["error"]["message"]
    assert "messages.0.content" in _send(client, "POST", "/api/chat", body).json()["error"]


def test_a_proper_surrogate_pair_is_text_and_passes(app_client):
    client = app_client()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "smile \U0001f600"}], "max_tokens": 2}
    raw = json.dumps(body)
    assert "\\ud83d\\ude00" in raw  # the pair travels as two escapes
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"a": [{"b": "x"}, {"c": ["y", "\udfff"]}]}, "a.1.c.1"),
        (["\ud800"], "0"),
        ("\udc00", "body"),
        ({"deep": [[[[{"k": "\ud8ff"}]]]]}, "deep.0.0.0.0.k"),
    ],
)
def test_the_walker_names_the_first_lone_surrogate(data, where):
    from localrun.server.errors import InvalidRequest

    with pytest.raises(InvalidRequest) as info:
        refuse_lone_surrogates(json.dumps(data).encode(), data)
    assert repr(where) in info.value.message
    json.dumps(info.value.message, ensure_ascii=False).encode("utf-8")  # the error itself is encodable


def test_no_escape_no_walk():
    data = {"a": "\ud800"}  # only reachable through an escape: raw bytes without one are not walked
    refuse_lone_surrogates(b'{"a": "plain"}', data)
    refuse_lone_surrogates(b'{"a": "\\\\ud800 is text"}', {"a": "\\ud800 is text"})  # an escaped backslash


@needs_llama
@pytest.mark.llama
def test_llama_cpp_answers_400_and_leaves_nothing_in_flight(serve_module, tiny_gguf):
    import httpx

    server = serve_module(tiny_gguf, n_threads=1)
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": LONE}], "max_tokens": 2})
    for path in ("/v1/chat/completions", "/completion", "/api/generate", "/v1/messages"):
        payload = body if path != "/completion" and path != "/api/generate" else body.replace('"messages"', '"prompt"')
        r = httpx.post(server.url + path, content=payload, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 400, (path, r.text)
    ok = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200, ok.text
    assert wait_until(lambda: health(server.url)["in_flight"] == 0, 5.0)


@pytest.mark.parametrize(
    ("path", "prompt"),
    [
        ("/v1/completions", ""),
        ("/v1/completions", [""]),
        ("/completions", ""),
        ("/completions", [""]),
        ("/completion", ""),
    ],
)
def test_an_empty_prompt_is_a_400_naming_the_prompt(app_client, path, prompt):
    r = app_client().post(path, json={"model": "tiny", "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt" and "empty" in r.json()["error"]["message"]


def test_an_empty_prompt_with_a_suffix_is_fill_in_the_middle_not_an_error(app_client):
    r = app_client().post("/v1/completions", json={"model": "tiny", "prompt": "", "suffix": "x", "max_tokens": 2})
    assert r.status_code != 400 or "empty" not in r.text  # the fake runtime refuses FIM itself, for another reason


@needs_llama
@pytest.mark.llama
def test_llama_cpp_empty_prompt_is_a_400_not_a_500(serve_module, tiny_gguf):
    import httpx

    server = serve_module(tiny_gguf, n_threads=1)
    for path in ("/v1/completions", "/completion"):
        r = httpx.post(server.url + path, json={"model": "tiny", "prompt": "", "max_tokens": 2}, timeout=60)
        assert r.status_code == 400 and "empty" in r.text, (path, r.text)
    assert wait_until(lambda: health(server.url)["in_flight"] == 0, 5.0)


@pytest.mark.parametrize("pad", [0, 300 * 1024], ids=["small", "large"])
def test_a_surrogate_written_as_utf8_bytes_is_a_400_naming_the_field(app_client, pad):
    """``\\xed\\xa0\\x80`` is a surrogate in (invalid) UTF-8: Python's parser decodes bytes with
    ``surrogatepass`` and took it, and the check looked for ``\\u`` escapes only, so it went on."""
    client = app_client()
    head = b'{"model": "tiny", "max_tokens": 2, "user": "' + b"x" * pad + b'", "messages": [{"role": "user", '
    raw = head + b'"content": "a\xed\xa0\x80b"}]}'
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "messages.0.content" in r.text and "surrogate" in r.text, r.text[:300]
