"""The TUI with an upstream: the Library lists its model with source ``upstream NAME (health)``,
the Server screen lists the upstream and its health."""

from __future__ import annotations

import pytest

from localrun.tui.server_view import ServerScreen
from tests.tui.conftest import make_facts, screen_text, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_library_and_server_screen_show_the_upstream(fake_upstream, tmp_path, tiny_gguf):
    from localrun.manager import ModelManager
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings, UpstreamConfig, UpstreamSettings
    from localrun.tui import make_app
    from localrun.upstreams.pool import UpstreamPool

    up = fake_upstream()
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", runtime={"force": "fake"})
    store = ModelStore(settings)
    store.import_path(tiny_gguf, name="mine")
    pool = UpstreamPool(
        [UpstreamConfig(name="box2", url=up.url, kind="localrun")], UpstreamSettings(probe_interval_s=0.3)
    )
    manager = ModelManager(settings, store, upstreams=pool)
    app = make_app(settings, store=store, manager=manager, facts=make_facts(), serve=False, poll_s=0.2)
    try:
        async with app.run_test(size=(140, 36)) as pilot:
            await wait_for(pilot, lambda: "upstream box2 (up)" in screen_text(app), what="upstream row in the library")
            assert "mine" in screen_text(app)
            await pilot.press("4")
            await wait_for(pilot, lambda: isinstance(app.screen, ServerScreen))
            await wait_for(
                pilot, lambda: "box2" in screen_text(app) and "localrun" in screen_text(app), what="upstream table"
            )
            text = screen_text(app)
            assert up.url in text and " up " in text and "tiny" in text
    finally:
        manager.shutdown()
