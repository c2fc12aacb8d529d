"""Token lists through the real server and a real llama.cpp worker: what one may carry.

Two bounds, and no third needed. A single list (``/api/generate``'s ``context``, a token-array
prompt, an embedding input) is useful only up to the model's context: a longer one is a 400 that
names the context and what to do, from the runtime, and the worker serves on. All lists of one
request together are bounded by ``MAX_TOKEN_IDS`` (4 Mi ids, server/validate.py), so a request
always fits one worker frame: past it, a 413 naming the field, before any model sees it.
Sending a request in several frames would only serve batches of more than 4 Mi ids in total
(each list shorter than the context): fourteen times what OpenAI's API takes in one embeddings
request (300,000 tokens), so they are refused by name instead.
"""

from __future__ import annotations

import json

import httpx
import pytest

from localrun.server.validate import MAX_TOKEN_IDS
from tests.conftest import needs_llama
from tests.factories import write_tiny_llama_gguf

pytestmark = [needs_llama, pytest.mark.llama]

N_CTX = 512


@pytest.fixture
def llama_stack(tmp_path, live_factory):
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.planning.planner import PlanOverrides
    from tests.support.stacks import Stack, make_settings

    settings = make_settings(max_body_bytes=48 * 1024 * 1024, runtime={"threads": 1, "parallel": 1})
    store = ModelStore(settings)
    store.import_path(write_tiny_llama_gguf(tmp_path / "tiny.gguf"), name="tiny")
    store.import_path(write_tiny_llama_gguf(tmp_path / "emb.gguf", extra_kv={"llama.pooling_type": 1}), name="emb")
    manager = ModelManager(settings, store, overrides=PlanOverrides(runtime="llama.cpp"))
    stack = Stack(settings, store, manager)
    try:
        yield stack, live_factory(stack).url
    finally:
        manager.shutdown()


def _post(url: str, path: str, body: dict) -> httpx.Response:
    raw = json.dumps(body, separators=(",", ":")).encode()
    return httpx.post(url + path, content=raw, headers={"content-type": "application/json"}, timeout=120)


def _error(r: httpx.Response) -> tuple[str, str | None]:
    error = r.json()["error"]
    return (error, None) if isinstance(error, str) else (error["message"], error.get("param"))


def test_a_list_past_the_context_is_a_400_and_lists_past_the_frame_a_413_the_worker_serving_on(llama_stack):
    stack, url = llama_stack
    assert _post(url, "/v1/completions", {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2}).status_code == 200
    assert _post(url, "/v1/embeddings", {"model": "emb", "input": [[5, 6]]}).status_code == 200
    pids = {m["name"]: m["pid"] for m in stack.manager.loaded()}
    n_ctx = {m["name"]: m["n_ctx"] for m in stack.manager.loaded()}

    long = [5] * 100_000  # past any context here, well within a frame: it crosses the pipe, the runtime refuses it
    for path, body in (
        ("/api/generate", {"model": "tiny", "prompt": "hi", "context": long, "stream": False}),
        ("/v1/completions", {"model": "tiny", "prompt": long, "max_tokens": 2}),
    ):
        r = _post(url, path, body)
        message, _ = _error(r)
        assert r.status_code == 400 and f"the context holds {n_ctx['tiny']}" in message, (path, r.text[:300])
    r = _post(url, "/v1/embeddings", {"model": "emb", "input": [[5, 6], long]})
    message, param = _error(r)
    assert r.status_code == 400 and "input[1]" in message and str(n_ctx["emb"]) in message, r.text[:300]

    # Each list within the context, too many ids together for one frame: a 413 naming the field.
    many = [[5] * 200 for _ in range(MAX_TOKEN_IDS // 200 + 1)]
    r = _post(url, "/v1/embeddings", {"model": "emb", "input": many})
    message, param = _error(r)
    assert r.status_code == 413 and param == "input" and str(MAX_TOKEN_IDS) in message, r.text[:300]

    # The same workers serve on.
    assert _post(url, "/v1/completions", {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2}).status_code == 200
    assert _post(url, "/v1/embeddings", {"model": "emb", "input": [[5, 6]]}).status_code == 200
    assert {m["name"]: m["pid"] for m in stack.manager.loaded()} == pids
