"""Each API's own default when a request sets no token limit.

OpenAI's legacy completions default ``max_tokens`` to 16 (its API reference); chat
completions, Responses, Ollama (``num_predict`` -1) and llama-server (``n_predict`` -1)
have no limit of their own, so they run to the server's cap; Anthropic requires
``max_tokens``. Before, the legacy route ran to the cap too.
"""

from __future__ import annotations

import pytest

CAP = 40
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def client(build_stack):
    from fastapi.testclient import TestClient

    from localrun.server.app import create_app

    stack = build_stack(options={"fake_reply_words": 200}, runtime={"max_tokens_cap": CAP})
    with TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost") as c:
        yield c


def _tokens(client, path: str, body: dict) -> int:
    r = client.post(path, json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    data = r.json()
    if path.startswith("/api/"):
        return data["eval_count"]
    if path == "/completion":
        return data["tokens_predicted"]
    if path == "/v1/responses":
        return data["usage"]["output_tokens"]
    return data["usage"]["completion_tokens"]


@pytest.mark.parametrize("path", ["/v1/completions", "/completions"])
def test_legacy_completions_default_to_16_tokens(client, path):
    assert _tokens(client, path, {"prompt": "once"}) == 16
    assert _tokens(client, path, {"prompt": "once", "max_tokens": None}) == 16
    assert _tokens(client, path, {"prompt": "once", "max_tokens": 20}) == 20
    assert _tokens(client, path, {"prompt": "once", "n_predict": -1}) == CAP  # llama-server's "no limit"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": USER}),
        ("/v1/responses", {"input": "hi"}),
        ("/api/generate", {"prompt": "once", "stream": False}),
        ("/api/chat", {"messages": USER, "stream": False}),
        ("/completion", {"prompt": "once"}),
    ],
)
def test_routes_without_a_default_of_their_own_run_to_the_cap(client, path, body):
    assert _tokens(client, path, body) == CAP


def test_anthropic_requires_max_tokens(client):
    r = client.post("/v1/messages", json={"model": "tiny", "messages": USER})
    assert r.status_code == 400 and "max_tokens" in r.text
