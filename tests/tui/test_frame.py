"""The frame around every screen: header, tabs (keys and mouse), footer bindings, the
command palette, 80×24 and resizing, light and dark themes, the hardware screen."""

from __future__ import annotations

import pytest

from localrun.tui.chat import ChatScreen
from localrun.tui.discover import DiscoverScreen
from localrun.tui.hardware_view import HardwareScreen
from localrun.tui.library import LibraryScreen
from localrun.tui.server_view import ServerScreen
from tests.tui.conftest import screen_text, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SCREENS = {
    "1": (LibraryScreen, "l Load"),
    "2": (DiscoverScreen, "/ Search"),
    "3": (HardwareScreen, "r Detect again"),
    "4": (ServerScreen, "u Unload"),
    "5": (ChatScreen, "esc Stop"),
}


async def test_every_screen_fits_80x24_with_header_and_footer(make):
    app = make()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "tiny" in screen_text(app))
        for key, (cls, footer) in SCREENS.items():
            await pilot.press(f"f{key}")  # F1–F5 switch from anywhere, a text field's focus included
            await wait_for(pilot, lambda cls=cls: isinstance(app.screen, cls), what=cls.__name__)
            await pilot.pause(0.1)
            rows = screen_text(app).splitlines()
            assert len(rows) == 24 and all(len(r) == 80 for r in rows)
            assert "1 Library" in rows[1] and "5 Chat" in rows[1]
            assert "not serving" in rows[0] and "4c" in rows[0]
            assert footer in rows[-1], (key, rows[-1])


async def test_resize_keeps_the_layout_and_the_status_line_whole(make):
    app = make(serve=True)
    async with app.run_test(size=(100, 32)) as pilot:
        await wait_for(pilot, lambda: "tiny" in screen_text(app) and app.server_state.mode == "embedded")
        url = app.server_state.url
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.2)
        rows = screen_text(app).splitlines()
        assert len(rows) == 24 and "tiny" in screen_text(app) and "l Load" in rows[-1]
        assert rows[0].strip() == f"{url} · key off · 0 loaded · 4c 16.0 GiB"  # the narrow wording, not cut
        await pilot.resize_terminal(140, 40)
        await pilot.pause(0.2)
        rows = screen_text(app).splitlines()
        assert len(rows) == 40 and rows[0].strip() == f"localrun ─ {url} ─ key: off ─ 0 loaded ─ CPU 4c · RAM 16.0 GiB"


async def test_tabs_work_with_the_mouse(make):
    app = make()
    async with app.run_test(size=(100, 32)) as pilot:
        await wait_for(pilot, lambda: "tiny" in screen_text(app))
        row = screen_text(app).splitlines()[1]
        await pilot.click(offset=(row.index("Hardware"), 1))
        await wait_for(pilot, lambda: isinstance(app.screen, HardwareScreen), what="hardware by click")
        row = screen_text(app).splitlines()[1]
        await pilot.click(offset=(row.index("Server"), 1))
        await wait_for(pilot, lambda: isinstance(app.screen, ServerScreen), what="server by click")


async def test_hardware_screen_shows_the_injected_profile_and_runtimes(make):
    app = make()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.press("3")
        await wait_for(pilot, lambda: "Test CPU 9000" in screen_text(app))
        text = screen_text(app)
        assert "12.0 GiB available of 16.0 GiB" in text and "avx2" in text and "GPU       none detected" in text
        assert "llama.cpp  ● ready" in text and "mlx        ✕ unavailable" in text
        assert "llama.cpp: ready — built for the CPU only" in text  # the highlighted runtime, in full
        await pilot.press("down")
        await wait_for(pilot, lambda: "to get it: pip install 'localrun[mlx]'" in screen_text(app))


async def test_command_palette_switches_screens_and_loads_models(make, manager):
    app = make()
    async with app.run_test(size=(100, 32)) as pilot:
        await wait_for(pilot, lambda: "tiny" in screen_text(app))
        await pilot.press("ctrl+p", *"go to hardware")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, HardwareScreen), what="palette switch")
        await pilot.press("ctrl+p", *"load tiny")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: manager.is_loaded("tiny"), what="palette load")
        await pilot.press("ctrl+p", *"chat with tiny")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen.model_select.value == "tiny")


async def test_light_and_dark_themes_recolour_the_badges(make):
    app = make()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: screen.table.row_count == 1)
        dark = str(screen.table.get_cell("tiny", "Fit").style)
        app.theme = "solarized-light"  # a light theme with its own green
        await pilot.pause(0.2)
        light = str(screen.table.get_cell("tiny", "Fit").style)
        assert dark and light and dark != light
        assert light == app.theme_variables["success"]
