"""``serve`` and ``mirror`` show what clients do at their default level, as llama-server and Ollama
do: one line per request (method, path, status, time, model, tokens; a refusal's reason), every
load; ``--quiet`` keeps them to warnings."""

from __future__ import annotations

import httpx

from tests.support.servers import free_port, wait_until

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _import_tiny(path) -> None:
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

    ModelStore(Settings()).import_path(path, name="tiny")


def test_serve_logs_each_request_load_and_refusal_by_default(spawn_server, tiny_gguf):
    _import_tiny(tiny_gguf)
    port = free_port()
    server = spawn_server(
        ["localrun", "serve", "--no-default-model", "--port", str(port)],
        port=port,
        env={"LOCALRUN_RUNTIME__FORCE": "fake"},
    )
    httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=30).raise_for_status()
    refused = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "model": "nope"}, timeout=30)
    assert refused.status_code == 404
    wait_until(lambda: "nope" in server.log_text(), 5)
    log = server.log_text()
    ok = next(line for line in log.splitlines() if '"POST /v1/chat/completions" 200' in line)
    assert "model=tiny" in ok and "completion_tokens=3" in ok and "ms" in ok
    bad = next(line for line in log.splitlines() if '"POST /v1/chat/completions" 404' in line)
    assert "reason=" in bad and "nope" in bad
    assert "loaded tiny" in log


def test_serve_quiet_logs_no_request_lines(spawn_server, tiny_gguf):
    _import_tiny(tiny_gguf)
    port = free_port()
    server = spawn_server(
        ["localrun", "serve", "--quiet", "--no-default-model", "--port", str(port)],
        port=port,
        env={"LOCALRUN_RUNTIME__FORCE": "fake"},
    )
    httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=30).raise_for_status()
    httpx.get(f"{server.url}/v1/models", timeout=30).raise_for_status()
    server.stop()
    log = server.log_text()
    assert "/v1/chat/completions" not in log and "loaded tiny" not in log


def test_mirror_logs_each_request(spawn_server):
    port = free_port()
    server = spawn_server(["localrun", "mirror", "--port", str(port)], port=port)
    missing = httpx.get(f"{server.url}/api/models/acme/none", timeout=30)
    assert missing.status_code == 404
    wait_until(lambda: "/api/models/acme/none" in server.log_text(), 5)
    line = next(ln for ln in server.log_text().splitlines() if "/api/models/acme/none" in ln)
    assert '"GET /api/models/acme/none" 404' in line and "reason=" in line
