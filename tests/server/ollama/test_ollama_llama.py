"""The Ollama wire on real llama.cpp (a ``localrun serve`` process on the tiny FIM GGUF): the
``context`` of /api/generate out and back in, fill-in-the-middle through ``suffix``, and the
capabilities /api/show reports for a model the runtime really serves."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

GREEDY = {"temperature": 0, "num_predict": 6, "seed": 1}


@pytest.fixture(scope="module")
def tiny(serve_module, tiny_fim):
    return serve_module(tiny_fim, plan={"n_threads": 1})


def post(server, path, body):
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def tokenize(server, text: str, *, add_special: bool) -> list[int]:
    return post(server, "/tokenize", {"content": text, "add_special": add_special}).json()["tokens"]


def test_generate_context_is_prompt_and_answer_tokens(tiny):
    r = post(
        tiny,
        "/api/generate",
        {"model": "tiny", "prompt": "hello world", "raw": True, "stream": False, "options": GREEDY},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    expected = tokenize(tiny, "hello world", add_special=True) + tokenize(tiny, body["response"], add_special=False)
    assert body["context"] == expected
    # Streamed: only the last line carries it, and it is the same.
    r = httpx.post(
        f"{tiny.url}/api/generate",
        json={"model": "tiny", "prompt": "hello world", "raw": True, "options": GREEDY},
        timeout=120,
    )
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert [("context" in line) for line in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1]["context"] == expected


def test_templated_generate_context_and_its_continuation(tiny):
    first = post(tiny, "/api/generate", {"model": "tiny", "prompt": "hello", "stream": False, "options": GREEDY}).json()
    assert first["context"] and all(isinstance(t, int) for t in first["context"])
    assert len(first["context"]) > first["prompt_eval_count"]  # the templated prompt, then the answer
    more = post(
        tiny,
        "/api/generate",
        {"model": "tiny", "prompt": "the world", "context": first["context"], "stream": False, "options": GREEDY},
    )
    assert more.status_code == 200, more.text
    follow = more.json()
    assert follow["prompt_eval_count"] > len(first["context"])  # the earlier tokens came first
    assert follow["context"][: len(first["context"])] == first["context"]


def test_suffix_fills_in_the_middle_and_show_says_insert(tiny):
    shown = post(tiny, "/api/show", {"model": "tiny"}).json()
    assert shown["capabilities"][0] == "completion" and "insert" in shown["capabilities"]
    r = post(
        tiny,
        "/api/generate",
        {"model": "tiny", "prompt": "def f(", "suffix": "return x", "stream": False, "options": GREEDY},
    )
    assert r.status_code == 200, r.text
    plain = post(
        tiny, "/api/generate", {"model": "tiny", "prompt": "def f(", "raw": True, "stream": False, "options": GREEDY}
    )
    # The suffix reached the runtime: the FIM prompt is longer than the prefix alone.
    assert r.json()["prompt_eval_count"] > plain.json()["prompt_eval_count"]
