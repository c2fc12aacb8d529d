"""Library screen under Pilot: rows with fit verdicts, load/unload/pin/delete/verify, the
details pane, filter and sort — asserting on posted messages, the manager and the screen."""

from __future__ import annotations

import pytest

from localrun.tui.library import LibraryScreen
from localrun.tui.messages import ModelsChanged, Notice
from tests.tui.conftest import screen_text, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def _names(messages, kind):
    return [m for m in messages if isinstance(m, kind)]


async def test_rows_show_format_quant_fit_and_source(make):
    app = make()
    async with app.run_test(size=(100, 32)) as pilot:
        await wait_for(pilot, lambda: "tiny" in screen_text(app), what="the tiny model's row")
        text = screen_text(app)
        assert "gguf" in text and "F32" in text and "imported" in text
        assert "● fits" in text  # the injected 16 GiB laptop fits a 0.5 MB model
        assert "fake" in text  # forced runtime, planned by the real planner


async def test_load_pin_unload_go_through_the_shared_manager(make, manager):
    messages: list = []
    app = make()
    async with app.run_test(size=(100, 32), message_hook=messages.append) as pilot:
        await wait_for(pilot, lambda: "tiny" in screen_text(app))
        await pilot.press("l")
        await wait_for(pilot, lambda: manager.is_loaded("tiny"), what="load")
        await wait_for(pilot, lambda: "loaded" in screen_text(app), what="state column")
        assert any(n.text == "Loaded tiny" for n in _names(messages, Notice))
        assert any(m.reason == "load tiny" for m in _names(messages, ModelsChanged))
        assert "1 loaded" in screen_text(app)  # the header follows

        await pilot.press("p")
        await wait_for(pilot, lambda: manager.loaded() and manager.loaded()[0]["pinned"], what="pin")
        await wait_for(pilot, lambda: "pinned" in screen_text(app))

        await pilot.press("p")  # toggles back
        await wait_for(pilot, lambda: not manager.loaded()[0]["pinned"], what="unpin")

        await pilot.press("u")
        await wait_for(pilot, lambda: not manager.is_loaded("tiny"), what="unload")
        await wait_for(pilot, lambda: any(n.text == "Unloaded tiny" for n in _names(messages, Notice)))


async def test_details_pane_has_gguf_metadata_and_the_plan_with_reasons(make):
    app = make()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, LibraryScreen)
        await wait_for(pilot, lambda: "architecture" in str(screen.details_pane.render()), what="details")
        details = str(screen.details_pane.render())
        assert "llama" in details and "context_length" in details
        assert "verdict" in details and "fits" in details
        assert "runtime   fake" in details  # render_plan's own lines
        assert "- " in details  # the reasons, one per line


async def test_delete_asks_first_and_no_keeps_the_model(make, store):
    messages: list = []
    app = make()
    async with app.run_test(size=(100, 32), message_hook=messages.append) as pilot:
        await wait_for(pilot, lambda: "tiny" in screen_text(app))
        await pilot.press("d")
        await wait_for(pilot, lambda: "Delete tiny?" in screen_text(app), what="confirmation")
        assert "stay on disk" in screen_text(app)  # imported: files are never deleted
        await pilot.press("n")
        await pilot.pause(0.2)
        assert [r.name for r in store.list()] == ["tiny"]

        await pilot.press("d")
        await wait_for(pilot, lambda: "Delete tiny?" in screen_text(app))
        await pilot.press("y")
        await wait_for(pilot, lambda: not store.list(), what="delete")
        await wait_for(pilot, lambda: "No models yet" in screen_text(app), what="empty library text")
        assert any(n.text == "Deleted tiny" for n in _names(messages, Notice))


async def test_verify_reports_matching_and_damaged_files(make, store, tiny_gguf, tmp_path):
    import shutil

    copy = tmp_path / "copy.gguf"
    shutil.copy(tiny_gguf, copy)
    store.import_path(copy, name="copy")
    store.verify("copy")  # records the sha256 (trust on first verify)
    messages: list = []
    app = make()
    async with app.run_test(size=(100, 32), message_hook=messages.append, notifications=True) as pilot:
        await wait_for(pilot, lambda: "copy" in screen_text(app))
        screen = app.screen
        screen.table.move_cursor(row=screen.table.get_row_index("copy"))
        await pilot.press("v")
        await wait_for(pilot, lambda: any("sha256" in n.text for n in _names(messages, Notice)), what="verify ok")

        data = bytearray(copy.read_bytes())
        data[-1] ^= 0xFF
        copy.write_bytes(bytes(data))
        await pilot.press("v")
        await wait_for(pilot, lambda: "File damaged" in screen_text(app), what="the error notification")
        assert "pull it again" in screen_text(app) or "import it again" in screen_text(app)


async def test_filter_and_sort(make, store, tiny_gguf, tmp_path):
    import shutil

    for name in ("alpha", "zulu"):
        shutil.copy(tiny_gguf, tmp_path / f"{name}.gguf")
        store.import_path(tmp_path / f"{name}.gguf", name=name)
    app = make()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: screen.table.row_count == 3, what="three rows")
        assert [r.name for r in screen.visible_rows()] == ["alpha", "tiny", "zulu"]
        await pilot.press("slash", *"zu")
        await pilot.pause(0.1)
        assert [r.name for r in screen.visible_rows()] == ["zulu"]
        assert screen.table.row_count == 1
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert screen.table.row_count == 3 and screen.table.has_focus
        screen._sort, screen._sort_reverse = "Name", True
        screen._render_rows()
        assert [r.name for r in screen.visible_rows()] == ["zulu", "tiny", "alpha"]
        await pilot.press("s")  # next sort key: Format (all gguf → by name)
        assert screen._sort == "Format"


async def test_load_error_shows_once_with_title_and_action(make, store, tmp_path):
    """A model whose file vanished: one notification naming the problem and what to do."""
    from tests.factories import write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "gone.gguf")
    store.import_path(path, name="gone")
    path.unlink()
    app = make()
    async with app.run_test(size=(100, 32), notifications=True) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: screen.table.row_count == 2)
        screen.table.move_cursor(row=screen.table.get_row_index("gone"))
        await pilot.press("l")
        await wait_for(
            pilot, lambda: len(app._notifications) and any(n.severity == "error" for n in app._notifications)
        )
        errors = [n for n in app._notifications if n.severity == "error"]
        assert len(errors) == 1
        assert errors[0].title == "Model not found" or errors[0].title.startswith(("Invalid", "Runtime"))
        assert "→" in errors[0].message
        await wait_for(pilot, lambda: errors[0].title in screen_text(app), what="the toast on screen")
        await pilot.press("l")  # the same failure again within the window: not shown twice
        await pilot.pause(0.5)
        assert len([n for n in app._notifications if n.severity == "error"]) == 1
