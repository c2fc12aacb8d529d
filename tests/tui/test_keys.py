"""Keys never lose input, focus always shows, every key answers.

After Esc the chat's typed text still reaches the prompt (a digit or a q is text there, not a
screen switch or a quit); a stray key in a sampling field cannot empty it and block every
send; digits typed into a text field are text; arrows reach every table, Discover's from its
search box; whatever has the focus carries the accent bar; ``p`` on a file already pulled
says so."""

from __future__ import annotations

import pytest
from textual import events

from localrun.tui.chat import ChatScreen
from localrun.tui.discover import DiscoverScreen
from localrun.tui.hardware_view import HardwareScreen
from localrun.tui.library import LibraryScreen
from localrun.tui.server_view import ServerScreen
from tests.hub import repos
from tests.hub.conftest import fake_hub  # noqa: F401 - the fixture
from tests.tui.conftest import screen_text, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

FOCUS_BAR = "▊"


async def _chat(pilot, app) -> ChatScreen:
    await pilot.press("f5")
    screen = await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen, what="chat")
    await wait_for(pilot, lambda: screen.model_select.value == "tiny", what="model list")
    return screen


async def test_text_typed_after_esc_reaches_the_prompt(make):
    app = make()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await _chat(pilot, app)
        await pilot.press(*"hel", "escape")
        assert screen.focused is screen.transcript  # Esc when idle: the arrows scroll the transcript
        await pilot.press(*"lo 2 q")  # before: "lo" dropped, "2" switched to Discover, "q" quit
        assert app.is_running and app.screen is screen
        assert screen.prompt.has_focus and screen.prompt.value == "hello 2 q"
        await pilot.press("escape")
        screen.transcript.post_message(events.Paste(" pasted"))  # a paste after Esc is not lost either
        await pilot.pause()
        assert screen.prompt.has_focus and screen.prompt.value == "hello 2 q pasted"
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.last_answer, what="the answer")
        assert screen.last_answer.startswith("You said: hello 2 q pasted")


async def test_enter_while_an_answer_streams_says_so_and_keeps_the_text(settings, store, planner, facts):
    import dataclasses

    from localrun.manager import ModelManager
    from localrun.tui import make_app

    def slow(record):
        plan = planner(record)
        return dataclasses.replace(plan, options={**plan.options, "fake_delay_s": 0.05, "fake_reply_words": 200})

    manager = ModelManager(settings, store, planner=slow)
    app = make_app(settings, store=store, manager=manager, facts=facts, serve=False)
    try:
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            screen = await _chat(pilot, app)
            await pilot.press(*"first", "enter")
            await wait_for(pilot, lambda: screen.generating and "ttft" in str(screen.stats.render()), what="streaming")
            await pilot.press(*"second", "enter")  # before: nothing happened, and nothing said why
            assert screen.prompt.value == "second"
            assert any("esc stops it" in n.message for n in app._notifications)
            await pilot.press("escape")
            await wait_for(pilot, lambda: not screen.generating, what="stopped")
    finally:
        manager.shutdown()


async def test_a_stray_key_in_max_never_blocks_a_send(make):
    app = make()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        screen = await _chat(pilot, app)
        knob = screen.query_one("#max-tokens")
        await pilot.click("#max-tokens")
        await pilot.press("end", "backspace", "backspace", "backspace", "x")
        assert knob.value == ""  # the letter is refused…
        notes = [n.message for n in app._notifications]
        assert any("max tokens takes a whole number from 1 to 1,000,000" in n for n in notes), notes  # …with a word
        await pilot.click("#prompt")
        assert knob.value == "512"  # left empty: the last good value is back, and the user is told
        assert any("max tokens was left empty: kept 512" in n.message for n in app._notifications)
        await pilot.press(*"hi", "enter")
        await wait_for(pilot, lambda: screen.last_answer, what="an answer: the send was not blocked")
        assert not [n for n in app._notifications if n.severity == "error"]


async def test_digits_typed_into_a_text_field_are_text(make):
    app = make()
    async with app.run_test(size=(80, 24)) as pilot:
        library = app.screen
        await pilot.press("slash", "2")
        assert isinstance(app.screen, LibraryScreen) and library.filter_input.value == "2"
        assert "F1 Library" in screen_text(app).splitlines()[1]  # the tabs say which keys switch now
        await pilot.press("backspace", "down")  # ↓ from the filter: the table takes the arrows
        assert library.table.has_focus and "F1 Library" not in screen_text(app).splitlines()[1]
        await pilot.press("escape", "2")  # the table has the keys: 2 is Discover
        discover = await wait_for(pilot, lambda: isinstance(app.screen, DiscoverScreen) and app.screen)
        assert discover.search_input.has_focus
        await pilot.press(*"3b")  # before: the empty search box sent "3" to Hardware
        assert app.screen is discover and discover.search_input.value == "3b"


async def test_a_letter_typed_on_a_table_starts_a_filter_or_a_search(make, fake_hub):  # noqa: F811
    app = make()
    async with app.run_test(size=(80, 24)) as pilot:
        library = app.screen
        await wait_for(pilot, lambda: library.table.row_count == 1, what="rows")
        assert library.table.has_focus
        await pilot.press(*"tin")  # before: dropped without a word
        assert library.filter_input.has_focus and library.filter_input.value == "tin"
        await pilot.press("escape", "2")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, DiscoverScreen) and app.screen)
        await pilot.press(*"tiny", "enter")
        await wait_for(pilot, lambda: screen.repos_table.has_focus and screen.repos_table.row_count >= 3)
        await pilot.press(*"gguf")  # g is nobody's key: a new search begins; then the box takes the rest
        assert screen.search_input.has_focus and screen.search_input.value == "tinygguf"


async def test_a_key_that_does_nothing_says_so(make):
    app = make()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, HardwareScreen), what="hardware")
        await pilot.press("x")  # before: nothing at all
        assert [n.message for n in app._notifications] == ["x does nothing here: this screen's keys are in the footer"]


async def test_arrows_move_discovers_selection_from_the_search_box(make, fake_hub):  # noqa: F811
    app = make()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("2")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, DiscoverScreen) and app.screen)
        await pilot.press(*"tiny", "enter")
        await wait_for(pilot, lambda: screen.repos_table.row_count >= 3, what="results")
        await pilot.press("slash", "down")  # back in the search box, ↓ hands the keys to the results
        assert screen.repos_table.has_focus
        await pilot.press("down")
        assert screen.repos_table.cursor_row == 1
        await pilot.press("up")
        assert screen.repos_table.cursor_row == 0


SCREENS = (
    ("f1", LibraryScreen),
    ("f2", DiscoverScreen),
    ("f3", HardwareScreen),
    ("f4", ServerScreen),
    ("f5", ChatScreen),
)


async def test_whatever_has_the_focus_shows_it_on_every_screen(make):
    app = make()
    async with app.run_test(size=(80, 24)) as pilot:
        for key, cls in SCREENS:
            await pilot.press(key)
            screen = await wait_for(
                pilot, lambda cls=cls: isinstance(app.screen, cls) and app.screen, what=cls.__name__
            )
            chain = [w for w in screen.focus_chain if w.region.area]
            assert chain, cls
            for widget in chain:
                widget.focus()
                await pilot.pause()
                lines = screen_text(app).splitlines()
                bottom = widget.region.bottom - (1 if widget.show_horizontal_scrollbar else 0)  # drawn over the bar
                bar = {y: lines[y][widget.region.x] for y in range(widget.region.y, bottom)}
                assert set(bar.values()) == {FOCUS_BAR}, (cls.__name__, widget, bar)


async def test_p_on_a_file_already_pulled_says_so(make, fake_hub, store):  # noqa: F811
    app = make()
    async with app.run_test(size=(110, 40), notifications=True) as pilot:
        await pilot.press("2")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, DiscoverScreen) and app.screen)
        await pilot.press(*"Tiny-GGUF", "enter")
        await wait_for(pilot, lambda: screen.files_table.row_count >= 5, what="files")
        await pilot.press("f", "p")
        await wait_for(pilot, lambda: any(r.repo == repos.GGUF_REPO for r in store.list()), what="pulled")
        await wait_for(pilot, lambda: not app.pulls.active_refs(), what="the pull's end")
        before = len(app._notifications)
        await pilot.press("p")  # the same file again
        await wait_for(pilot, lambda: len(app._notifications) > before, what="a word about it", timeout=10)
        note = list(app._notifications)[-1]
        assert note.title == "Already pulled" and "testorg/tiny-gguf:q4_k_m" in note.message
        await pilot.press("up", "up", "up", "up", "up", "up", "tab", "shift+tab")  # the repo row, as a repo
        screen.repos_table.focus()
        before = len(app._notifications)
        await pilot.press("p")
        await wait_for(pilot, lambda: len(app._notifications) > before, what="a word about the repo", timeout=10)
        assert list(app._notifications)[-1].title == "Already pulled"
        assert not app.pulls.active_refs()
