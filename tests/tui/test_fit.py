"""Every screen usable at 80×24 and at 120×40: nothing on it is cut mid-word — the footer's
keys, the offline banner, the delete dialog, the chat's settings row — read from the
composited screen and compared with the widgets' own texts (tests/tui/fitcheck.py)."""

from __future__ import annotations

import pytest

from localrun.tui.chat import ChatScreen
from localrun.tui.discover import DiscoverScreen
from localrun.tui.hardware_view import HardwareScreen
from localrun.tui.library import LibraryScreen
from localrun.tui.modals import ConfirmModal
from localrun.tui.server_view import ServerScreen
from tests.support.servers import free_port
from tests.tui.conftest import screen_text, wait_for
from tests.tui.fitcheck import cut_texts

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

LONG = "some-org/a-rather-long-model-name-instruct:q4_k_m"
SCREENS = (("f2", DiscoverScreen), ("f3", HardwareScreen), ("f4", ServerScreen), ("f5", ChatScreen))


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
async def test_no_screen_cuts_a_word(make, store, tiny_gguf, monkeypatch, size):
    store.import_path(tiny_gguf, name=LONG)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # the offline banner, at its longest
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    app = make()
    found: dict[str, list[str]] = {}
    async with app.run_test(size=size) as pilot:
        library = app.screen
        assert isinstance(library, LibraryScreen)
        await wait_for(pilot, lambda: library.table.row_count == 2 and "fits" in screen_text(app), what="rows")
        found["library"] = cut_texts(app)
        library.table.move_cursor(row=library.table.get_row_index(LONG))
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the delete dialog")
        await pilot.pause(0.05)
        found["delete dialog"] = cut_texts(app)
        await pilot.press("n")
        for key, cls in SCREENS:
            await pilot.press(key)
            screen = await wait_for(
                pilot, lambda cls=cls: isinstance(app.screen, cls) and app.screen, what=cls.__name__
            )
            if cls is DiscoverScreen:
                await wait_for(pilot, lambda s=screen: "Offline" in str(s.note.render()), what="the offline banner")
            if cls is ChatScreen:
                screen.select_model(LONG)
            await pilot.pause(0.1)
            found[cls.__name__] = cut_texts(app)
    cut = "\n".join(f"{where}: {problem}" for where, problems in found.items() for problem in problems)
    assert not cut, f"cut at {size[0]}x{size[1]}:\n{cut}"
