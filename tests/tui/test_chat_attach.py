"""Chat attaches an image by path to the next message (issue 19): ``/image PATH`` for a model whose
projector sees, a line in the transcript says so, the message carries the file to the runtime;
a model without vision, a missing file and a bare ``/image`` are refused with a notice. The
Library shows what each model takes. Under Pilot, on the fake runtime through the shared manager."""

from __future__ import annotations

import pytest

from localrun.tui.chat import ChatScreen
from localrun.tui.library import LibraryScreen
from localrun.types import MEDIA_MARKER
from tests.support.projector_headers import AUDIO_ONLY, GEMMA3, pair, write_projector
from tests.tui.conftest import screen_text, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 200


@pytest.fixture
def vision_store(store, tmp_path):
    pair(store, "tiny", "tiny-vision", write_projector(tmp_path / "mmproj-v.gguf", GEMMA3))
    pair(store, "tiny", "tiny-audio", write_projector(tmp_path / "mmproj-a.gguf", AUDIO_ONLY))
    return store


async def _chat_with(pilot, app, model: str) -> ChatScreen:
    await pilot.press("5")
    screen = await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen, what="chat screen")
    await wait_for(pilot, lambda: model in screen._records, what="model list")
    screen.select_model(model)
    await wait_for(pilot, lambda: screen.model_select.value == model, what=f"{model} chosen")
    return screen


async def _type(pilot, text: str) -> None:
    await pilot.press(*text, "enter")


def _notices(app) -> str:
    return " ".join(str(n.message) for n in app._notifications)


async def test_image_attaches_to_the_next_message_and_says_so(vision_store, make, manager, tmp_path):
    cat = tmp_path / "cat.png"
    cat.write_bytes(PNG)
    sent = []
    stream = manager.stream
    manager.stream = lambda name, req, cancel=None, **kw: (sent.append(req), stream(name, req, cancel, **kw))[1]
    app = make()
    async with app.run_test(size=(110, 32)) as pilot:
        screen = await _chat_with(pilot, app, "tiny-vision")
        await _type(pilot, f"/image {cat}")
        await wait_for(pilot, lambda: screen.attached, what="the attachment")
        assert f"attached image {cat}" in " ".join(screen_text(app).split())
        assert screen.prompt.value == "" and not screen.history  # nothing sent yet
        await _type(pilot, "what is this?")
        await wait_for(pilot, lambda: screen.last_answer, what="an answer")
        (user, _answer) = screen.history
        assert [(m.kind, m.data, m.mime) for m in user.media] == [("image", PNG, "image/png")]
        assert user.content == MEDIA_MARKER + "\nwhat is this?"
        assert sent and sent[-1].media == user.media  # the request the runtime got carries it
        assert screen.attached == []  # one message only
        await _type(pilot, "and again?")
        await wait_for(pilot, lambda: len(screen.history) == 4, what="the second answer")
        assert screen.history[2].media == () and sent[-1].media == user.media  # the history keeps the first


async def test_a_model_without_vision_is_refused_with_the_hint(vision_store, make, tmp_path):
    cat = tmp_path / "cat.png"
    cat.write_bytes(PNG)
    app = make()
    async with app.run_test(size=(110, 32)) as pilot:
        screen = await _chat_with(pilot, app, "tiny")
        await _type(pilot, f"/image {cat}")
        await wait_for(pilot, lambda: "cannot take image input" in _notices(app), what="the refusal")
        assert "--mmproj" in _notices(app)
        assert screen.attached == [] and screen.prompt.value == f"/image {cat}"  # kept, to fix and retry
        screen.prompt.value = ""
        screen.select_model("tiny-audio")
        await wait_for(pilot, lambda: screen.model_select.value == "tiny-audio")
        await _type(pilot, f"/image {cat}")
        await wait_for(pilot, lambda: "takes audio" in _notices(app), what="an audio-only projector's refusal")
        assert screen.attached == []


async def test_a_missing_file_and_a_bare_command_are_refused(vision_store, make, tmp_path):
    app = make()
    async with app.run_test(size=(110, 32)) as pilot:
        screen = await _chat_with(pilot, app, "tiny-vision")
        await _type(pilot, f"/image {tmp_path / 'nope.png'}")
        await wait_for(pilot, lambda: "does not exist" in _notices(app), what="the missing file")
        screen.prompt.value = ""
        await _type(pilot, "/image")
        await wait_for(pilot, lambda: "needs a file" in _notices(app), what="the bare command")
        assert screen.attached == [] and not screen.history


async def test_library_shows_what_each_model_takes(vision_store, make):
    app = make()
    async with app.run_test(size=(120, 32)) as pilot:
        screen = await wait_for(pilot, lambda: isinstance(app.screen, LibraryScreen) and app.screen)
        await wait_for(pilot, lambda: "tiny-audio" in screen_text(app), what="the rows")
        rows = {r.name: r.format_text for r in screen._rows}
        assert rows == {"tiny": "gguf", "tiny-vision": "gguf · vision", "tiny-audio": "gguf · audio"}
        assert "gguf · vision" in screen_text(app)
        screen.filter_input.value = "vision"
        await wait_for(pilot, lambda: [r.name for r in screen.visible_rows()] == ["tiny-vision"], what="filter")


async def test_help_clear_and_unknown_commands_are_never_sent(vision_store, make, manager):
    sent = []
    stream = manager.stream
    manager.stream = lambda name, req, cancel=None, **kw: (sent.append(req), stream(name, req, cancel, **kw))[1]
    app = make()
    async with app.run_test(size=(110, 32)) as pilot:
        screen = await _chat_with(pilot, app, "tiny")
        await _type(pilot, "/?")
        await wait_for(pilot, lambda: "/image PATH" in screen_text(app), what="the help")
        await _type(pilot, "/help")
        screen.prompt.value = ""
        await _type(pilot, "/nope")
        await wait_for(pilot, lambda: "unknown command '/nope'" in _notices(app), what="the unknown command")
        assert not sent and not screen.history  # nothing reached the model
        screen.prompt.value = ""
        await _type(pilot, "hello")
        await wait_for(pilot, lambda: len(screen.history) == 2, what="an answer")
        await _type(pilot, "/clear")
        await wait_for(pilot, lambda: not screen.history, what="the history cleared")
        assert "conversation cleared" in screen_text(app)
