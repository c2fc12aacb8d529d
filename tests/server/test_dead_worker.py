"""Requests queued behind a llama.cpp worker that was SIGKILLed get a retryable answer.

A worker that dies takes its requests with it, but the server lives and the next request
starts a new worker, so what the queued clients should hear is "retry" (503 with
``Retry-After``, which the OpenAI and Anthropic SDKs retry on their own), not a 500 that
reads as a server bug.
"""

from __future__ import annotations

import os
import signal
import threading

import httpx
import pytest

from tests.conftest import needs_llama
from tests.support.servers import free_port, health, wait_until

pytestmark = [needs_llama, pytest.mark.llama]

QUEUED = 3


@pytest.fixture
def server(spawn_server, tmp_path):
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings
    from tests.factories import write_tiny_llama_gguf

    # Big enough that 3,000 tokens take seconds on a slow machine; one slot, so the rest queue.
    model = write_tiny_llama_gguf(tmp_path / "long.gguf", n_embd=256, n_layer=4, n_ff=512, n_ctx_train=4096)
    ModelStore(Settings()).import_path(model, name="long")
    port = free_port()
    args = ["tests.support.launch", "--port", str(port), "--option", "n_slots=1", "--plan", "n_threads=1"]
    return spawn_server(args, port=port, env={"LOCALRUN_RUNTIME__FORCE": ""})


def test_requests_queued_behind_a_killed_worker_get_503_with_retry_after(server):
    body = {"model": "long", "prompt": "once upon a time", "max_tokens": 3000, "temperature": 0}
    answers: list[httpx.Response] = []

    def queued() -> None:
        answers.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=60))

    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60) as running:
        lines = running.iter_lines()
        assert next(lines)  # the one slot is busy generating
        threads = [threading.Thread(target=queued) for _ in range(QUEUED)]
        for t in threads:
            t.start()
        assert wait_until(lambda: health(server.url)["in_flight"] == 1 + QUEUED, 10.0), health(server.url)
        info = health(server.url)["models"][0]
        assert info["runtime"] == "llama.cpp" and info["pid"] != server.pid
        os.kill(info["pid"], signal.SIGKILL)
        for t in threads:
            t.join(30)
        rest = "\n".join(lines)  # the running stream ends with an error event, not silence
        assert "error" in rest

    assert len(answers) == QUEUED
    for r in answers:
        assert r.status_code == 503, r.text
        assert r.headers.get("retry-after") == "1"
        assert r.json()["error"]["code"] == "worker_crashed"
        assert "retry" in r.json()["error"]["message"]

    again = httpx.post(f"{server.url}/v1/completions", json={**body, "max_tokens": 4}, timeout=60)
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 4
    after = health(server.url)
    assert after["worker_restarts"] == 1 and after["in_flight"] == 0
    assert after["models"][0]["pid"] not in (info["pid"], server.pid)


def test_the_anthropic_shape_of_a_dead_worker_is_retryable_too():
    from localrun.errors import WorkerCrashed
    from localrun.server.anthropic.errors import ANTHROPIC
    from localrun.server.errors import error_response

    r = error_response(WorkerCrashed("the worker stopped", hint="retry"), ANTHROPIC)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert b'"overloaded_error"' in r.body  # what the Anthropic SDK retries
