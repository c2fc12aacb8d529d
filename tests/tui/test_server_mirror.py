"""The TUI's embedded server with ``server.mirror``: the store is served as a hub endpoint on
the same port and the Server screen says so (and says how to turn it on when it is off)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from localrun.tui.server_view import ServerScreen
from tests.tui.conftest import screen_text, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


async def test_server_screen_shows_the_mirror(make, settings):
    settings.server.mirror = True
    app = make(serve=True)
    async with app.run_test(size=(150, 32)) as pilot:
        await wait_for(pilot, lambda: app.server_state.mode == "embedded", what="server up")
        url = app.server_state.url
        await pilot.press("4")
        await wait_for(pilot, lambda: isinstance(app.screen, ServerScreen))
        await wait_for(pilot, lambda: f"HF_ENDPOINT={url}" in screen_text(app), what="the mirror line")
        tree = await asyncio.to_thread(lambda: httpx.get(f"{url}/api/models/local/tiny/tree/main").json())
        assert [e["path"] for e in tree] == ["tiny-llama.gguf"]


async def test_server_screen_says_how_to_turn_the_mirror_on(make):
    app = make(serve=True)
    async with app.run_test(size=(150, 32)) as pilot:
        await wait_for(pilot, lambda: app.server_state.mode == "embedded", what="server up")
        await pilot.press("4")
        await wait_for(pilot, lambda: "Hub mirror: off" in screen_text(app), what="the mirror line")
        assert "serve --mirror" in screen_text(app)
        got = await asyncio.to_thread(lambda: httpx.get(f"{app.server_state.url}/api/models/local/tiny").status_code)
        assert got == 404  # off means off
