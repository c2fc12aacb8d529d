"""Lifecycle: disconnects cancel generations, queue overflow answers 503, a dead worker
becomes an error for its client (never a hang), and the server process refuses bad setups."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

from tests.conftest import needs_llama
from tests.support.servers import free_port, health, wait_until

SLOW = {"fake_delay_s": 0.02, "fake_reply_words": 2000}  # a 40 s answer unless cancelled
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "go on"}], "stream": True}


def in_flight(stack) -> int:
    from tests.support.stacks import in_flight_by_model

    return sum(in_flight_by_model(stack.manager).values())


def test_client_disconnect_mid_stream_stops_the_generation(build_stack, live_factory):
    stack = build_stack(options=SLOW)
    live = live_factory(stack)
    for path, body in (
        ("/v1/chat/completions", CHAT),
        ("/api/chat", {**CHAT, "stream": True}),
        ("/v1/completions", {"model": "tiny", "prompt": "x", "stream": True}),
    ):
        with httpx.stream("POST", f"{live.url}{path}", json=body, timeout=10) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(3)]
            assert any(line for line in got)
            assert in_flight(stack) == 1
        # the connection is closed: within 1 s nothing is left running in the runtime
        assert wait_until(lambda: in_flight(stack) == 0, 1.0), path
        assert wait_until(lambda: health(live.url)["queue_depth"] == 0, 1.0)


def test_disconnect_before_the_first_token_and_without_streaming(build_stack, live_factory):
    stack = build_stack(options={"fake_delay_s": 0.05, "fake_reply_words": 2000})
    live = live_factory(stack)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}  # not streamed: 100 s of work
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=httpx.Timeout(5, read=0.5))
    assert wait_until(lambda: in_flight(stack) == 0, 1.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{live.url}/api/generate",
            json={"model": "tiny", "prompt": "x", "stream": False},
            timeout=httpx.Timeout(5, read=0.5),
        )
    assert wait_until(lambda: in_flight(stack) == 0, 1.0)


def test_many_clients_disconnecting_at_random_leave_nothing_running(build_stack, live_factory):
    stack = build_stack(options={"fake_delay_s": 0.005, "fake_reply_words": 5000}, queue_size=64)
    live = live_factory(stack)
    rng = random.Random(7)
    errors: list[BaseException] = []

    def client(n_lines: int, path: str) -> None:
        try:
            with httpx.stream("POST", f"{live.url}{path}", json=CHAT, timeout=30) as r:
                for i, _ in enumerate(r.iter_lines()):
                    if i >= n_lines:
                        break
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=client, args=(rng.randint(0, 6), rng.choice(["/v1/chat/completions", "/api/chat"])))
        for _ in range(100)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert wait_until(lambda: in_flight(stack) == 0, 1.0)
    assert health(live.url)["queue_depth"] == 0
    # and the model still answers
    r = httpx.post(f"{live.url}/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2}, timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def raw_request(url: str, path: str, body: dict) -> socket.socket:
    """Send a request on a bare socket and leave it unread: a client that holds its slot."""
    port = int(url.rsplit(":", 1)[1])
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: "
        f"{len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def test_queue_overflow_is_503_with_retry_after(build_stack, live_factory):
    stack = build_stack(options=SLOW, queue_size=2)
    live = live_factory(stack)
    held = [raw_request(live.url, "/v1/chat/completions", CHAT) for _ in range(2)]  # one runs, one waits
    try:
        assert wait_until(lambda: health(live.url)["queue_depth"] == 2, 5)
        r = httpx.post(f"{live.url}/v1/chat/completions", json=CHAT, timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "overloaded"
        r = httpx.post(f"{live.url}/api/chat", json=CHAT, timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and "queued" in r.json()["error"]
        with openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as oai:
            with pytest.raises(openai.InternalServerError) as info:
                oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
            assert info.value.status_code == 503
    finally:
        for sock in held:
            sock.close()
    # both clients are gone, the running one and the waiting one: their slots come back
    assert wait_until(lambda: health(live.url)["queue_depth"] == 0, 1.0)
    assert wait_until(lambda: in_flight(stack) == 0, 1.0)
    r = httpx.post(f"{live.url}/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1}, timeout=10)
    assert r.status_code == 200


def test_metrics_count_requests_tokens_and_latency(live):
    httpx.post(f"{live.url}/v1/chat/completions", json={**CHAT, "max_tokens": 5}, timeout=10).raise_for_status()
    httpx.post(
        f"{live.url}/v1/chat/completions",
        json={"model": "ghost", "messages": [{"role": "user", "content": "x"}]},
        timeout=10,
    )
    text = httpx.get(f"{live.url}/metrics").text
    assert 'localrun_requests_total{route="/v1/chat/completions",method="POST",status="200"} 1' in text
    assert 'localrun_requests_total{route="/v1/chat/completions",method="POST",status="404"} 1' in text
    assert 'localrun_completion_tokens_total{model="tiny"} 5' in text
    assert 'localrun_time_to_first_token_seconds_count{model="tiny"} 1' in text
    assert "localrun_inter_token_latency_seconds_count 4" in text
    assert 'localrun_queue_depth{model="tiny"} 0' in text and "localrun_models_loaded 1" in text
    assert "localrun_worker_restarts_total 0" in text


def test_access_log_line_per_request(live, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="localrun.server.access"):
        httpx.post(f"{live.url}/v1/chat/completions", json={**CHAT, "max_tokens": 4}, timeout=10).raise_for_status()
        wait_until(lambda: any("model=tiny" in r.getMessage() for r in caplog.records), 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "localrun.server.access"]
    assert len(lines) == 1
    assert "/v1/chat/completions" in lines[0] and " 200 " in lines[0]
    assert (
        "model=tiny" in lines[0] and "completion_tokens=4" in lines[0] and "ttft=" in lines[0] and "tok/s=" in lines[0]
    )


# --- real server processes ---------------------------------------------------------------


def test_non_loopback_host_without_key_refuses_to_start(spawn_server):
    port = free_port()
    for args in (
        ["localrun", "serve", "--host", "0.0.0.0", "--no-default-model", "--port", str(port)],
        ["tests.support.launch", "--host", "0.0.0.0", "--port", str(port)],
    ):
        server = spawn_server(args, port=port, wait=False)
        assert server.proc.wait(60) == 2
        assert "refusing to listen on 0.0.0.0" in server.log_text() and "API key" in server.log_text()


def test_port_in_use_is_a_clear_error_naming_it(spawn_server):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = spawn_server(["localrun", "serve", "--no-default-model", "--port", str(port)], port=port, wait=False)
        assert server.proc.wait(60) == 2
        assert f"port {port}" in server.log_text() and "in use" in server.log_text()


def test_cli_serve_with_official_client_and_key_never_logged(spawn_server, tiny_gguf):
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

    ModelStore(Settings()).import_path(tiny_gguf, name="tiny")
    key = "sk-local-" + os.urandom(8).hex()
    port = free_port()
    server = spawn_server(
        ["localrun", "--log-level", "DEBUG", "serve", "--no-default-model", "--port", str(port)],
        port=port,
        env={"LOCALRUN_RUNTIME__FORCE": "fake", "LOCALRUN_API_KEY": key},
    )
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0) as oai:
        r = oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert r.usage.completion_tokens == 3
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=key + "x", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
    server.stop()
    log = server.log_text()
    assert "model=tiny" in log  # the access log is there…
    assert key not in log  # …and the key is not


@needs_llama
def test_kill_worker_mid_stream_errors_fast_and_server_survives(spawn_server, tmp_path):
    """A real llama.cpp worker killed with SIGKILL mid-stream: error within 2 s, same server."""
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings
    from tests.factories import write_tiny_llama_gguf

    model = write_tiny_llama_gguf(tmp_path / "long.gguf", n_embd=256, n_layer=4, n_ff=512, n_ctx_train=4096)
    ModelStore(Settings()).import_path(model, name="long")
    port = free_port()
    server = spawn_server(["tests.support.launch", "--port", str(port)], port=port, env={"LOCALRUN_RUNTIME__FORCE": ""})
    body = {"model": "long", "prompt": "once upon a time", "max_tokens": 3000, "temperature": 0, "stream": True}
    # a client that leaves: the worker stops generating (its in-flight count drops) within 1 s
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert [next(lines) for _ in range(4)]
        assert health(server.url)["in_flight"] == 1
    assert wait_until(lambda: health(server.url)["in_flight"] == 0, 1.0)
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30) as oai:
        stream = oai.completions.create(**{k: v for k, v in body.items()})
        pieces = [next(iter(stream)).choices[0].text for _ in range(3)]
        info = health(server.url)["models"][0]
        assert info["runtime"] == "llama.cpp" and info["pid"] != server.pid
        os.kill(info["pid"], signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(openai.APIError) as err:
            for _ in stream:
                pass
        assert time.monotonic() - killed < 2.0
        assert "stopped" in err.value.message or "worker" in err.value.message
        assert pieces
        assert server.proc.poll() is None and health(server.url)["pid"] == server.pid
        again = oai.completions.create(model="long", prompt="hello", max_tokens=4, temperature=0)
        assert again.usage.completion_tokens == 4
        assert health(server.url)["worker_restarts"] == 1
        assert health(server.url)["models"][0]["pid"] not in (info["pid"], server.pid)


def test_uvicorn_binds_itself_so_connections_keep_tcp_nodelay(live):
    """A socket handed to uvicorn loses TCP_NODELAY (+≈40 ms per keep-alive request); ours has it."""
    with httpx.Client(base_url=live.url) as c:
        for _ in range(3):
            assert c.get("/health").status_code == 200
        conns = list(live.server.server_state.connections)
        assert conns
        for proto in conns:
            sock = proto.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_embedded_server_in_an_existing_loop_leaves_signals_alone(stack):
    """The TUI's way: ``await server.serve()`` in its own loop, Ctrl-C left to the app."""
    import asyncio

    from localrun.server.serve import build_server

    settings = stack.settings.model_copy(update={"server": stack.settings.server.model_copy(update={"port": 0})})
    urls: list[str] = []

    async def main() -> int:
        before = signal.getsignal(signal.SIGINT)
        server = build_server(settings, stack.manager, ready_callback=urls.append, handle_signals=False)
        task = asyncio.create_task(server.serve())
        while not urls:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient() as c:
            status = (await c.get(f"{urls[0]}/health")).status_code
        assert signal.getsignal(signal.SIGINT) is before
        server.should_exit = True
        await task
        return status

    assert asyncio.run(main()) == 200


def test_unload_during_a_stream_ends_it_with_an_error_not_a_hang(build_stack, live_factory):
    live = live_factory(build_stack(options=SLOW))
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0, timeout=10) as oai:
        for _ in range(200):
            stream = iter(
                oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], stream=True)
            )
            assert next(stream).choices
            started = time.monotonic()
            assert httpx.post(f"{live.url}/admin/unload", json={"model": "tiny"}, timeout=10).json()["unloaded"] is True
            with pytest.raises(openai.APIError, match="cancelled"):
                for _ in stream:
                    pass
            assert time.monotonic() - started < 2.0
    assert live.stack.manager.loaded() == []
