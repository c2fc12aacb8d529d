"""litellm's Ollama providers (``ollama/``, ``ollama_chat/``: aider's Ollama path), replayed.

litellm is too heavy for the test extra (hundreds of MB with its tokenizers and cost maps), so
its exact requests were captured once (litellm_capture.py, against a recording stub) into
litellm_requests.json; each is sent here byte for byte to the app on the fake runtime, and the
answer is read the way litellm reads it (NDJSON lines when streaming, one object otherwise).
litellm sends no Content-Type on generation; the copy that adds one proves the Ollama side,
and the verbatim copy waits for the Content-Type rule (the "guards" part of issue 21).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CAPTURED = json.loads((Path(__file__).with_name("litellm_requests.json")).read_text())
REQUESTS = [(case["case"], r) for case in CAPTURED["cases"] for r in case["requests"]]


def _check(path: str, sent: dict, r) -> None:
    assert r.status_code == 200, (path, r.text)
    if path in ("/api/chat", "/api/generate") and sent.get("stream") is not False:
        lines = [json.loads(line) for line in r.text.splitlines()]
        assert lines[-1]["done"] and all(not line["done"] for line in lines[:-1])
        key = "message" if path == "/api/chat" else "response"
        assert all(key in line for line in lines)
        return
    body = r.json()
    if path == "/api/chat":
        assert body["done"] and body["message"]["role"] == "assistant"
        if sent.get("tools"):
            assert [c["function"]["name"] for c in body["message"]["tool_calls"]] == ["lookup"]
        if sent.get("format") == "json":
            assert isinstance(json.loads(body["message"]["content"]), dict)
    elif path == "/api/generate":
        assert body["done"] and isinstance(body["response"], str)
    elif path == "/api/show":
        assert "completion" in body["capabilities"] and isinstance(body["model_info"], dict)
    elif path == "/api/embed":
        assert len(body["embeddings"]) == len(sent["input"])


@pytest.fixture
def litellm_client(app_client):
    return app_client()  # the fake runtime with every capability: tools, JSON, embeddings


@pytest.mark.parametrize(("case", "request_"), REQUESTS, ids=[f"{c}: {r['path']}" for c, r in REQUESTS])
def test_litellm_request_with_a_content_type(litellm_client, case, request_):
    content = json.dumps(request_["body"]).encode()
    r = litellm_client.request(
        request_["method"], request_["path"], content=content, headers={"content-type": "application/json"}
    )
    _check(request_["path"], request_["body"], r)


VERBATIM = [(c, r) for c, r in REQUESTS if r["content_type"] is None]


@pytest.mark.parametrize(("case", "request_"), VERBATIM, ids=[f"{c}: {r['path']}" for c, r in VERBATIM])
def test_litellm_request_verbatim(litellm_client, case, request_):
    r = litellm_client.request(request_["method"], request_["path"], content=json.dumps(request_["body"]).encode())
    _check(request_["path"], request_["body"], r)
