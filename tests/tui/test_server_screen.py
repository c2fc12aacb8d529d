"""The embedded server: served from the TUI's loop over the same manager, its request log
and sparkline, attaching to another localrun, and a port held by something else."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from localrun.tui.messages import RequestLogged, ServerChanged
from localrun.tui.server_view import ServerScreen
from tests.support.servers import free_port
from tests.tui.conftest import screen_text, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def _openai_chat(url: str, model: str, prompt: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], stream=True)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


async def test_openai_client_is_served_by_the_tuis_manager_and_logged(make, manager):
    messages: list = []
    app = make(serve=True)
    async with app.run_test(size=(110, 32), message_hook=messages.append) as pilot:
        await wait_for(pilot, lambda: app.server_state.mode == "embedded", what="server up")
        url = app.server_state.url
        assert url.endswith(f":{app.settings.server.port}")
        await pilot.press("4")
        await wait_for(pilot, lambda: isinstance(app.screen, ServerScreen))
        assert f"Listening {url}" in screen_text(app) and "key: off" in screen_text(app)

        text = await asyncio.to_thread(_openai_chat, url, "tiny", "ping from an app")
        assert text.startswith("You said: ping from an app")
        assert manager.is_loaded("tiny")  # loaded by the server in the manager the TUI shows

        entry = (
            await wait_for(
                pilot,
                lambda: [
                    m.entry
                    for m in messages
                    if isinstance(m, RequestLogged) and m.entry.route == "/v1/chat/completions"
                ],
                what="log entry",
            )
        )[0]
        assert (entry.method, entry.model, entry.status) == ("POST", "tiny", 200)
        assert entry.completion_tokens > 1 and entry.ttft_s is not None and entry.tok_s
        await wait_for(pilot, lambda: "/v1/chat/completions" in screen_text(app), what="log row")
        await wait_for(pilot, lambda: " tiny " in screen_text(app) and "fake" in screen_text(app), what="loaded row")
        await wait_for(pilot, lambda: max(app.token_rates) > 0, what="a tokens/s sample", timeout=5)
        # The sample lands before the screen's next refresh draws it: wait for that draw.
        await wait_for(pilot, lambda: "peak" in screen_text(app), what="the tokens/s peak drawn", timeout=5)

        await pilot.press("u")  # unload from the server screen
        await wait_for(pilot, lambda: not manager.is_loaded("tiny"), what="unload")
    assert any(m.state.mode == "embedded" for m in messages if isinstance(m, ServerChanged))


async def test_server_stops_with_the_app(make):
    app = make(serve=True)
    async with app.run_test(size=(100, 32)) as pilot:
        await wait_for(pilot, lambda: app.server_state.mode == "embedded")
        port = app.settings.server.port
    with socket.socket() as s:  # the port is free again: uvicorn shut down inside the app's loop
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


async def test_port_held_by_another_program_offers_a_free_port(make, settings):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", settings.server.port))
    blocker.listen()
    threading.Thread(target=lambda: [blocker.accept()[0].close() for _ in range(3)], daemon=True).start()
    app = make(serve=True)
    try:
        async with app.run_test(size=(100, 32)) as pilot:
            await wait_for(pilot, lambda: "The server port is taken" in screen_text(app), what="the port modal")
            assert f"port {settings.server.port}" in screen_text(app)
            await pilot.press("enter")  # "Serve on <free port>" has focus
            await wait_for(pilot, lambda: app.server_state.mode == "embedded", what="served elsewhere")
            assert not app.server_state.url.endswith(f":{settings.server.port}")
    finally:
        blocker.close()


async def test_port_held_by_another_localrun_attaches_as_a_client(settings, store, facts, planner):
    """`localrun serve` owns the port: the TUI manages its models over HTTP instead of serving."""
    from localrun.manager import ModelManager
    from localrun.server.serve import build_server
    from localrun.tui import make_app

    other = ModelManager(settings, store, planner=planner)
    server = build_server(settings, other)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.02)
        app = make_app(settings, store=store, facts=facts, serve=True, poll_s=0.2)
        async with app.run_test(size=(100, 32)) as pilot:
            await wait_for(pilot, lambda: app.server_state.mode == "attached", what="attached")
            assert app.backend.mode == "attached"
            assert "(attached)" in screen_text(app)
            await wait_for(pilot, lambda: "tiny" in screen_text(app), what="remote model list")
            await pilot.press("l")
            await wait_for(pilot, lambda: other.is_loaded("tiny"), what="loaded in the other process's manager")
            await wait_for(pilot, lambda: "1 loaded" in screen_text(app), what="header shows the remote state")
            await pilot.press("u")
            await wait_for(pilot, lambda: not other.is_loaded("tiny"), what="remote unload")
        app.owned_manager.shutdown()
    finally:
        server.should_exit = True
        thread.join(10)
        other.shutdown()


def test_free_port_helper_finds_one():
    from localrun.tui.embedded import check_port, find_free_port

    port = free_port()
    assert check_port("127.0.0.1", port).state == "free"
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        held = check_port("127.0.0.1", port, timeout_s=0.5)
        assert held.state == "other"
        nxt = find_free_port("127.0.0.1", port)
        assert nxt is not None and nxt != port
