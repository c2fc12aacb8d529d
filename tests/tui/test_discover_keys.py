"""Discover's keys, the way a new user types: the search box has the focus on arrival, a
bare q never quits, quitting during a pull asks first, and an unreachable hub is called
"offline" as soon as the screen opens."""

from __future__ import annotations

import pytest

from localrun.tui.discover import DiscoverScreen
from localrun.tui.modals import ConfirmModal
from tests.hub import repos
from tests.hub.conftest import fake_hub  # noqa: F401 - the fixture
from tests.tui.conftest import screen_text, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


async def _open(pilot, app) -> DiscoverScreen:
    await pilot.press("2")
    return await wait_for(pilot, lambda: isinstance(app.screen, DiscoverScreen) and app.screen, what="discover")


async def test_typing_qwen_searches_instead_of_quitting(make, fake_hub):  # noqa: F811
    app = make()
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _open(pilot, app)
        assert screen.search_input.has_focus
        await pilot.press(*"qtiny")
        assert app.is_running and screen.search_input.value == "qtiny"
        await pilot.press(*["backspace"] * 5, *"tiny", "enter")
        await wait_for(pilot, lambda: screen.repos_table.row_count >= 3, what="results")
        assert screen.repos_table.has_focus  # results take the keys: p pulls, f goes to the files
        await pilot.press("q")  # a bare letter on the table starts a new search, it never quits
        assert app.is_running and screen.search_input.has_focus and screen.search_input.value.endswith("q")


async def test_slash_still_opens_the_search_and_is_not_typed(make, fake_hub):  # noqa: F811
    app = make()
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _open(pilot, app)
        await pilot.press("slash", *"org/x")
        assert screen.search_input.value == "org/x"


async def test_quit_while_pulling_asks_first(make, fake_hub, store):  # noqa: F811
    fake_hub.add_repo("slow/Big-GGUF", {"Big-Q4_K_M.gguf": repos.make_gguf(payload=1_500_000, seed=5)}, tags=("gguf",))
    fake_hub.faults.throttle_bps = 200_000
    app = make()
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _open(pilot, app)
        await pilot.press(*"Big-GGUF", "enter")
        await wait_for(pilot, lambda: screen.repos_table.row_count, what="result")
        screen.repos_table.move_cursor(row=screen.repos_table.get_row_index("slow/Big-GGUF"))
        await wait_for(pilot, lambda: screen.files_table.row_count == 1, what="files")
        await pilot.press("f", "p")
        await wait_for(pilot, lambda: app.pulls.active_refs(), what="a running pull")
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the question")
        assert "pull(s) running" in screen_text(app)
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, DiscoverScreen), what="back on discover")
        assert app.is_running and app.pulls.active_refs()
        await pilot.press("ctrl+q")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the question again")
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running, what="the app to quit")
    assert not any(r.name.startswith("slow/") for r in store.list())


async def test_unreachable_hub_says_offline_when_the_screen_opens(make, monkeypatch):
    from tests.support.servers import free_port

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    app = make()
    async with app.run_test(size=(110, 40), notifications=True) as pilot:
        screen = await _open(pilot, app)
        await wait_for(pilot, lambda: "Offline" in str(screen.note.render()), what="the offline note")
        note = str(screen.note.render())
        assert "could not be reached" in note and "HF_HUB_OFFLINE=1" in note and "cannot connect" in note
        # what a search finds instead, truthfully: this HF cache is empty (it once promised "the models on disk")
        assert "holds no models to search either" in note and "Showing the models on disk" not in note
        await pilot.press(*"qwen", "enter")
        await wait_for(pilot, lambda: "Nothing matches" in str(screen.note.render()), what="an explained empty result")
        assert "Offline" in str(screen.note.render()) and app.is_running
        assert not [n for n in app._notifications if n.severity == "error"]
