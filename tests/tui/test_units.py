"""Pure pieces of the TUI, tested without an app: formatters, the error mapping, request
metering (middleware + the manager's request timings), the attached backend's wire parsing."""

from __future__ import annotations

import asyncio

import pytest

from localrun import errors as E
from localrun.tui import format as F
from localrun.tui.errors import TITLES, describe_error
from localrun.tui.metering import RequestMeter
from localrun.types import Chunk, Usage


def test_sizes_durations_rates_and_counts():
    assert F.human_bytes(None) == "—"
    assert F.human_bytes(512) == "512 B"
    assert F.human_bytes(253_000_000) == "241 MiB"
    assert F.human_bytes(4_400_000_000) == "4.1 GiB"
    assert F.human_duration(12.4) == "12 s"
    assert F.human_duration(288) == "4:48"
    assert F.human_duration(3723) == "1:02:03"
    assert F.human_duration(None) == "—"
    assert F.human_count(1_200_000) == "1.2 M" and F.human_count(12_400) == "12.4 k" and F.human_count(310) == "310"
    assert F.eta(100, 400, 100.0) == "3 s" and F.eta(5, None, 1.0) == "—" and F.eta(5, 10, None) == "—"
    assert F.progress_bar(0.5, 10) == "█████░░░░░" and F.progress_bar(2.0, 4) == "████"
    assert F.human_rate(38_000_000) == "36.2 MiB/s"


def test_verdict_badges_use_theme_colours():
    theme = {"success": "#00ff00", "warning": "#ffff00", "error": "#ff0000"}
    fits = F.verdict_badge("fits", theme)
    assert fits.plain == "● fits" and str(fits.style) == "#00ff00"
    assert F.verdict_badge("tight", theme).plain == "◐ tight"
    wont = F.verdict_badge("wont-fit", theme, detail="no Metal")
    assert wont.plain == "✕ no Metal" and str(wont.style) == "#ff0000"
    assert F.verdict_badge(None).plain == "…"


def test_every_error_class_has_a_title_and_an_action():
    for cls in (c for c in E.LocalrunError.__subclasses__() if c.__module__ == "localrun.errors"):
        assert cls in TITLES, f"{cls.__name__} has no title in the TUI"
        view = describe_error(cls("something broke"))
        assert view.title and view.message == "something broke" and view.action


def test_an_error_class_from_elsewhere_gets_its_parents_title():
    class Special(E.ModelNotFound):
        pass

    view = describe_error(Special("gone"))
    assert view.title == "Model not found" and view.action.startswith("check the name")


def test_error_hint_wins_over_the_default_action():
    view = describe_error(E.WontFit("too big", hint="pick Q4_0"))
    assert (view.title, view.action) == ("Model won't fit", "pick Q4_0")
    assert view.text() == "too big\n→ pick Q4_0"


def test_unexpected_errors_point_at_the_log():
    view = describe_error(KeyError("x"), doing="load tiny", log_hint="/tmp/tui.log")
    assert view.title == "Unexpected error while trying to load tiny"
    assert "KeyError" in view.message and "/tmp/tui.log" in view.action


def test_tui_chats_are_logged_from_the_managers_timing_and_counted():
    """A stream with no HTTP request around it (a chat typed in the TUI) makes its own entry from
    the timing the manager hands the meter; its tokens count while it runs and after."""
    from localrun.activity import start_timing

    entries = []
    meter = RequestMeter(entries.append)
    timing = start_timing("m", [meter.observe])
    for chunk in (Chunk("a"), Chunk(" b")):
        timing.note(chunk)
    assert meter.tokens_total == 2 and not entries  # still running
    timing.note(Chunk(" c", finish_reason="stop", usage=Usage(prompt_tokens=7, completion_tokens=3)))
    timing.end(failed=False)
    assert meter.tokens_total == 3
    (e,) = entries
    assert (e.method, e.route, e.model, e.prompt_tokens, e.completion_tokens, e.status) == (
        "TUI",
        "chat",
        "m",
        7,
        3,
        200,
    )
    assert e.ttft_s is not None and e.ttft_s >= 0
    failed = start_timing("m", [meter.observe])
    failed.end(failed=True, cancelled=True)
    assert entries[-1].status == 499


def test_the_meter_follows_a_real_managers_streams():
    from localrun.manager import ModelManager
    from localrun.settings import load_settings
    from localrun.types import ChatRequest, Message, Plan, Sampling
    from tests.core.test_manager import DictStore

    entries = []
    meter = RequestMeter(entries.append)
    manager = ModelManager(load_settings(), DictStore("a"), planner=lambda r: Plan(runtime="fake", n_ctx=256))
    manager.observe_requests(meter.observe)
    try:
        req = ChatRequest((Message("user", "hi"),), Sampling(max_tokens=5, temperature=0.0))
        text = "".join(c.text for c in manager.stream("a", req))
        (e,) = entries
        assert text and (e.model, e.status) == ("a", 200) and e.completion_tokens == meter.tokens_total > 0
    finally:
        manager.shutdown()


def test_middleware_records_route_status_and_the_servers_stats():
    from localrun.server.metrics import STATS_KEY, RequestStats

    entries = []
    meter = RequestMeter(entries.append)

    async def app(scope, receive, send):
        stats = RequestStats(model="tiny", prompt_tokens=4, completion_tokens=9)
        stats.first_token_at = stats.start + 0.05
        stats.last_token_at = stats.start + 0.45
        scope[STATS_KEY] = stats
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent = []

    async def send(message):
        sent.append(message)

    async def run(path):
        await meter.middleware(app)({"type": "http", "method": "POST", "path": path}, None, send)

    asyncio.run(run("/v1/chat/completions"))
    asyncio.run(run("/health"))  # polled routes stay out of the log
    assert len(sent) == 4
    (e,) = entries
    assert (e.route, e.model, e.status, e.prompt_tokens, e.completion_tokens) == (
        "/v1/chat/completions",
        "tiny",
        201,
        4,
        9,
    )
    assert e.ttft_s == pytest.approx(0.05) and e.tok_s == pytest.approx(8 / 0.4)


def test_middleware_strips_control_characters_from_paths():
    entries = []
    meter = RequestMeter(entries.append)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 404, "headers": []})

    async def send(message):
        pass

    asyncio.run(meter.middleware(app)({"type": "http", "method": "GET", "path": "/x\x1b[2Jy"}, None, send))
    assert entries[0].route == "/x[2Jy" and entries[0].status == 404


def test_remote_ndjson_chunks():
    from localrun.tui.remote import _chunk_from_ndjson

    assert _chunk_from_ndjson({"message": {"content": "hi"}, "done": False}) == Chunk("hi")
    last = _chunk_from_ndjson(
        {"message": {"content": ""}, "done": True, "done_reason": "length", "prompt_eval_count": 5, "eval_count": 2}
    )
    assert last.finish_reason == "length" and last.usage == Usage(5, 2)
    assert _chunk_from_ndjson({"response": "x", "done": False}).text == "x"
    with pytest.raises(E.LocalrunError):
        _chunk_from_ndjson({"error": "model crashed"})


def test_metadata_lines_are_bounded_and_skip_the_template(tiny_gguf, settings):
    from localrun.modelstore.store import ModelStore
    from localrun.tui.backend import metadata_lines

    record = ModelStore(settings).import_path(tiny_gguf, name="tiny")
    lines = metadata_lines(record)
    assert lines[0].startswith("tiny · gguf ·")
    assert all(len(line) <= 100 for line in lines[:-1])  # the path line may be long
    assert any(line.startswith("chat_template") and "chars" in line for line in lines)
    assert lines[-1].startswith("path") and str(tiny_gguf) in lines[-1]


def test_the_server_screen_shows_each_models_prompt_cache_from_the_manager():
    from localrun.tui.backend import LocalBackend

    class Manager:
        def loaded(self):
            return [{"name": "gemma", "runtime": "llama.cpp"}, {"name": "other", "runtime": "fake"}]

        def cache_stats(self):
            return {
                "gemma": {
                    "slots_held": 2,
                    "slot_tokens": 900,
                    "host_entries": 1,
                    "host_tokens": 300,
                    "host_bytes": 2_500_000,
                    "disk_entries": 4,
                    "disk_tokens": 16_000,
                    "disk_bytes": 310_000_000,
                }
            }

    gemma, other = LocalBackend(store=None, manager=Manager()).loaded()
    assert F.cache_cell(gemma.cache, "ram") == "3 · 1200 tok · 2.4 MiB"
    assert F.cache_cell(gemma.cache, "disk") == "4 · 16000 tok · 296 MiB"
    assert other.cache is None and F.cache_cell(other.cache, "disk") == "-"
