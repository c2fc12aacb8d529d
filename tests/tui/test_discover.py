"""Discover under Pilot against the fake hub: search, a repo's quants with size and fit,
pull with per-file progress that survives a screen switch, cancel, offline and an
unreachable hub explained in words."""

from __future__ import annotations

import pytest

from localrun.tui.discover import DiscoverScreen
from localrun.tui.messages import DownloadUpdated, ModelsChanged
from tests.hub import repos
from tests.hub.conftest import fake_hub  # noqa: F401 - the fixture
from tests.tui.conftest import screen_text, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


async def _search(pilot, app, query: str) -> DiscoverScreen:
    await pilot.press("2")
    screen = await wait_for(pilot, lambda: isinstance(app.screen, DiscoverScreen) and app.screen, what="discover")
    await pilot.press("slash", *query, "enter")
    return screen


async def test_search_lists_repos_and_quants_with_fit(make, fake_hub):  # noqa: F811
    app = make()
    async with app.run_test(size=(110, 40)) as pilot:
        screen = await _search(pilot, app, "tiny")
        await wait_for(pilot, lambda: screen.repos_table.row_count >= 3, what="search results")
        text = screen_text(app)
        assert repos.GGUF_REPO in text and repos.MLX_REPO in text and f"hub: {fake_hub.url}" in text
        # the most downloaded repo is highlighted first; its quants come in with a fit badge
        await wait_for(pilot, lambda: screen.files_table.row_count >= 5, what="the repo's files")
        text = screen_text(app)
        for quant in ("Q4_K_M", "Q8_0", "Q5_K_M", "Q4_0", "F16"):
            assert quant in text
        assert "mmproj" not in text and "imatrix" not in text  # sidecars are never offered
        assert "● fits" in text and "ctx" in text
        first = screen.files_table.coordinate_to_cell_key((0, 0)).row_key.value
        assert first == f"{repos.GGUF_REPO}/Tiny-Q4_K_M.gguf"  # the usual pick comes first


async def test_pull_shows_progress_and_lands_in_the_library(make, fake_hub, store):  # noqa: F811
    messages: list = []
    app = make()
    async with app.run_test(size=(110, 40), message_hook=messages.append) as pilot:
        screen = await _search(pilot, app, "Tiny-GGUF")
        await wait_for(pilot, lambda: screen.files_table.row_count >= 5, what="files")
        await pilot.press("f", "p")
        await wait_for(pilot, lambda: any(r.name == "testorg/tiny-gguf:q4_k_m" for r in store.list()), what="pulled")
        updates = [m.state for m in messages if isinstance(m, DownloadUpdated)]
        assert any(u.file == "Tiny-Q4_K_M.gguf" and u.total and u.done == u.total for u in updates)
        await wait_for(pilot, lambda: any(isinstance(m, ModelsChanged) and "pulled" in m.reason for m in messages))
        await wait_for(pilot, lambda: "Tiny-Q4_K_M.gguf" in screen_text(app) and "done" in screen_text(app))
        await pilot.press("1")
        await wait_for(pilot, lambda: "testorg/tiny-gguf:q4_k_m" in screen_text(app), what="library row")


async def test_pull_keeps_going_across_screens_and_can_be_cancelled(make, fake_hub, store):  # noqa: F811
    fake_hub.add_repo("slow/Big-GGUF", {"Big-Q4_K_M.gguf": repos.make_gguf(payload=1_500_000, seed=5)}, tags=("gguf",))
    fake_hub.faults.throttle_bps = 300_000
    messages: list = []
    app = make()
    async with app.run_test(size=(110, 40), message_hook=messages.append) as pilot:
        screen = await _search(pilot, app, "Big-GGUF")
        await wait_for(pilot, lambda: screen.repos_table.row_count, what="result")
        screen.repos_table.move_cursor(row=screen.repos_table.get_row_index("slow/Big-GGUF"))
        await wait_for(pilot, lambda: screen.files_table.row_count == 1, what="files")
        await pilot.press("f", "p")
        await wait_for(
            pilot,
            lambda: any(isinstance(m, DownloadUpdated) and m.state.done > 0 and m.state.active for m in messages),
            what="bytes arriving",
        )
        await pilot.press("3")  # another screen: the pull goes on, the header says so
        await wait_for(pilot, lambda: "↓ 1 pulling" in screen_text(app), what="header pull count")
        await pilot.press("2", "x")
        await wait_for(pilot, lambda: any(d.status == "cancelled" for d in app.downloads), what="cancelled")
        assert not any(r.name.startswith("slow/") for r in store.list())
        await wait_for(pilot, lambda: "↓" not in screen_text(app), what="no pull left")


async def test_offline_mode_is_explained_and_searches_the_cache(make, fake_hub, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    app = make()
    async with app.run_test(size=(110, 40), notifications=True) as pilot:
        screen = await _search(pilot, app, "tiny")
        await wait_for(pilot, lambda: "Nothing matches" in screen_text(app), what="an empty cache search")
        text = screen_text(app)
        assert "offline — searching the models on disk" in text and "HF_HUB_OFFLINE" in text
        assert not app._notifications  # an explanation, not an error
        assert screen.repos_table.row_count == 0


async def test_unreachable_hub_is_a_note_not_an_error_wall(make, monkeypatch):
    """What the hub module raises when the network is down becomes a note (huggingface_hub's
    own retries take ~25 s against a closed port, so the failure is injected here)."""
    from localrun.errors import DownloadFailed
    from localrun.modelstore import hub

    def unreachable(query, **kw):
        raise DownloadFailed(
            "cannot reach the hub at https://huggingface.co: [Errno 101] Network is unreachable",
            hint="check the network",
        )

    monkeypatch.setattr(hub, "search", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    app = make()
    async with app.run_test(size=(110, 40), notifications=True) as pilot:
        screen = await _search(pilot, app, "qwen")
        await wait_for(pilot, lambda: "could not be reached" in screen_text(app), what="the note")
        note = str(screen.note.render())
        assert "Network is unreachable" in note and "HF_HUB_OFFLINE=1" in note
        assert not [n for n in app._notifications if n.severity == "error"]


def test_offers_group_split_files_and_order_quants():
    from localrun.tui.offers import offers_from_files

    sizes = {f"Q8_0/Big-Q8_0-0000{i}-of-00003.gguf": 100 for i in (1, 2, 3)}
    sizes.update({"Big-Q4_0.gguf": 50, "mmproj-F16.gguf": 10, "README.md": 1})
    offers = offers_from_files("o/r", sizes)
    assert [(o.quant, o.size, o.parts) for o in offers] == [("Q8_0", 300, 3), ("Q4_0", 50, 1)]
    assert offers[0].ref == "o/r/Q8_0/Big-Q8_0-00001-of-00003.gguf"
    mlx = offers_from_files("m/x", {"config.json": 10, "model.safetensors": 90, "tokenizer.json": 5})
    assert [(o.file, o.format.value, o.ref) for o in mlx] == [("(whole repo)", "mlx", "m/x")]
    assert offers_from_files("n/a", {"README.md": 1}) == []
