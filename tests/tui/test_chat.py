"""Chat screen under Pilot: a streamed Markdown answer from the fake runtime through the
shared manager, stop mid-answer, TTFT and tok/s, copy, sampling validation, history."""

from __future__ import annotations

import dataclasses

import pytest

from localrun.tui.chat import ChatScreen, parse_sampling, rate_text
from tests.tui.conftest import screen_text, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def slow_manager(settings, store, planner):
    """The fake runtime, 40 ms per token and a long reply: slow enough to stop mid-answer."""
    from localrun.manager import ModelManager

    def slow(record):
        plan = planner(record)
        return dataclasses.replace(plan, options={**plan.options, "fake_delay_s": 0.04, "fake_reply_words": 400})

    manager = ModelManager(settings, store, planner=slow)
    yield manager
    manager.shutdown()


async def _open_chat(pilot, app) -> ChatScreen:
    await pilot.press("5")
    screen = await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen, what="chat screen")
    await wait_for(pilot, lambda: screen.model_select.value == "tiny", what="model list")
    return screen


async def test_answer_streams_as_markdown_with_stats(make, manager):
    messages: list = []
    app = make()
    async with app.run_test(size=(100, 32), message_hook=messages.append) as pilot:
        screen = await _open_chat(pilot, app)
        await pilot.press(*"what is gguf?", "enter")
        await wait_for(pilot, lambda: screen.last_answer, what="an answer")
        assert screen.last_answer.startswith("You said: what is gguf?")
        tokens = [m for m in messages if isinstance(m, ChatScreen.Tokens)]
        finished = [m for m in messages if isinstance(m, ChatScreen.Finished)]
        assert tokens and len(finished) == 1
        assert "".join(t.text for t in tokens) == finished[0].text == screen.last_answer
        assert finished[0].finish_reason == "stop"
        text = screen_text(app)
        assert "You said: what is gguf?" in text and "ttft" in text and "tok/s" in text
        assert manager.is_loaded("tiny")  # chat loads through the manager the server shares
        assert [m.role for m in screen.history] == ["user", "assistant"]
        # the TUI's own chat shows in the server's request log
        assert any(e.route == "chat" and e.model == "tiny" and e.completion_tokens > 1 for e in app.request_log)


async def test_history_and_system_prompt_reach_the_model(make):
    app = make()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await _open_chat(pilot, app)
        await pilot.click("#system")
        await pilot.press(*"be brief")
        await pilot.click("#prompt")
        await pilot.press(*"first", "enter")
        await wait_for(pilot, lambda: len(screen.history) == 2)
        await pilot.press(*"second", "enter")
        await wait_for(pilot, lambda: len(screen.history) == 4)
        assert screen.last_answer.startswith("You said: second")
        assert screen.current_settings().system == "be brief"
        await pilot.press("ctrl+l")
        await pilot.pause(0.1)
        assert screen.history == [] and "You said" not in screen_text(app)


async def test_escape_stops_mid_answer(make, slow_manager, settings, store, facts):
    from localrun.tui import make_app

    messages: list = []
    app = make_app(settings, store=store, manager=slow_manager, facts=facts, serve=False)
    async with app.run_test(size=(100, 32), message_hook=messages.append) as pilot:
        screen = await _open_chat(pilot, app)
        await pilot.press(*"hello", "enter")
        await wait_for(pilot, lambda: any(isinstance(m, ChatScreen.Tokens) for m in messages), what="first tokens")
        assert screen.generating
        await pilot.press("escape")
        finished = await wait_for(
            pilot, lambda: [m for m in messages if isinstance(m, ChatScreen.Finished)], what="stop"
        )
        assert finished[0].finish_reason == "cancelled"
        assert 0 < len(finished[0].text.split()) < 400
        assert "stopped" in screen_text(app)
        assert not screen.generating


async def test_copy_last_answer(make):
    app = make()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await _open_chat(pilot, app)
        await pilot.press("ctrl+y")  # nothing yet: a note, no crash
        await pilot.press(*"copy me", "enter")
        await wait_for(pilot, lambda: screen.last_answer)
        await pilot.press("ctrl+y")
        assert app.clipboard == screen.last_answer


async def test_a_bad_sampling_value_goes_back_to_the_last_good_one_with_one_note(make):
    app = make()
    async with app.run_test(size=(100, 32), notifications=True) as pilot:
        screen = await _open_chat(pilot, app)
        screen.query_one("#temperature").value = "hot"  # set from outside: the typed keys are refused anyway
        await pilot.click("#prompt")
        await pilot.press(*"hi", "enter")
        await wait_for(pilot, lambda: screen.last_answer, what="an answer: the send is not blocked")
        assert screen.query_one("#temperature").value == "0.7"
        notes = list(app._notifications)
        assert [n.severity for n in notes] == ["warning"]
        assert "temperature 'hot' is not a number: kept 0.7" in notes[0].message


def test_parse_sampling_bounds():
    s = parse_sampling("0.2", "0.5", "64")
    assert (s.temperature, s.top_p, s.max_tokens) == (0.2, 0.5, 64)
    from localrun.errors import ConfigError

    for args in (("3", "0.5", "64"), ("0.2", "1.5", "64"), ("0.2", "0.5", "0"), ("x", "0.5", "1")):
        with pytest.raises(ConfigError):
            parse_sampling(*args)


def test_rate_text():
    assert rate_text(0.041, 11, 0.5, running=True) == "ttft 41 ms · 20.0 tok/s · 11 tokens · esc stop"
    assert rate_text(None, 0, 0.0, running=False).startswith("waiting")


@pytest.mark.llama
async def test_chat_with_the_tiny_gguf_on_real_llama_cpp(settings, store, facts):
    """The same screen over a real worker process running llama.cpp (random weights: any text)."""
    from localrun.manager import ModelManager
    from localrun.planning.planner import PlanOverrides, plan_placement
    from localrun.tui import make_app
    from tests.conftest import llama_available

    if not llama_available():
        pytest.skip("llama-cpp-python is not installed")
    hw, statuses = facts
    manager = ModelManager(
        settings,
        store,
        planner=lambda r: plan_placement(
            r, hw, statuses, overrides=PlanOverrides(runtime="llama.cpp"), settings=settings
        ),
    )
    messages: list = []
    app = make_app(settings, store=store, manager=manager, facts=facts, serve=False)
    try:
        async with app.run_test(size=(100, 32), message_hook=messages.append) as pilot:
            screen = await _open_chat(pilot, app)
            screen.query_one("#max-tokens").value = "8"
            await pilot.click("#prompt")
            await pilot.press(*"hi", "enter")
            finished = await wait_for(
                pilot,
                lambda: [m for m in messages if isinstance(m, ChatScreen.Finished)],
                what="an answer from llama.cpp",
                timeout=60,
            )
            assert finished[0].finish_reason in ("stop", "length")
            assert manager.loaded()[0]["runtime"] == "llama.cpp" and manager.loaded()[0]["pid"]
            assert "ttft" in screen_text(app)
    finally:
        manager.shutdown()


async def test_a_reasoning_models_thinking_shows_in_its_own_block_above_the_answer(
    settings, store, planner, facts, tmp_path
):
    """The fake runtime thinks (``fake_think_words``) behind a GGUF whose template has a <think> channel."""
    from localrun.manager import ModelManager
    from localrun.tui import make_app
    from localrun.tui.chat import ThinkingBlock
    from tests.factories import write_tiny_llama_gguf
    from tests.server.test_reasoning import THINK_TEMPLATE

    store.import_path(write_tiny_llama_gguf(tmp_path / "tiny-r1.gguf", chat_template=THINK_TEMPLATE), name="r1")

    def thinking(record):
        plan = planner(record)
        return dataclasses.replace(plan, options={**plan.options, "fake_think_words": 14, "fake_reply_words": 3})

    manager = ModelManager(settings, store, planner=thinking)
    messages: list = []
    app = make_app(settings, store=store, manager=manager, facts=facts, serve=False)
    try:
        async with app.run_test(size=(100, 32), message_hook=messages.append) as pilot:
            await pilot.press("5")
            screen = await wait_for(
                pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen, what="chat screen"
            )
            screen.select_model("r1")
            await wait_for(pilot, lambda: screen.model_select.value == "r1", what="the reasoning model chosen")
            screen.query_one("#temperature").value = "0"  # the fixed filler: none of the thinking's words in the answer
            await pilot.click("#prompt")
            await pilot.press(*"hello", "enter")
            await wait_for(pilot, lambda: screen.last_answer, what="an answer")
            assert screen.last_answer.startswith("You said: hello.") and "llamas" not in screen.last_answer
            assert "think>" not in screen.last_answer and screen.history[-1].content == screen.last_answer
            block = screen.query_one(ThinkingBlock)
            assert block.text.strip().endswith("seven small llamas count")
            shown = list(screen.transcript.children)
            assert shown.index(block) == len(shown) - 2  # between the "ai" label and the answer
            text = screen_text(app)
            assert "Thinking…" in text and "llamas count" in text and "think>" not in text
            assert "".join(m.reasoning for m in messages if isinstance(m, ChatScreen.Tokens)) == block.text
    finally:
        manager.shutdown()
