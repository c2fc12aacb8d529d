"""Context on request: Ollama's options.num_ctx reloads a model with more context (once, by tiers, never
in the middle of someone else's request) or clamps it; every overflow error names the option that fixes it.

The fake runtime honours the plan's n_ctx (its prompts overflow at it), so these run in seconds over a
real socket; tests/runtimes holds the llama.cpp side."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from localrun.planning.context import grown_context
from localrun.types import Plan
from tests.factories import write_tiny_llama_gguf

LOADED = 2048


@pytest.fixture(scope="module")
def long_gguf(tmp_path_factory):
    """The tiny llama, but stating a 64k trained context, so reloads have room to grow."""
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("long") / "long.gguf", n_ctx_train=65536)


def sized_planner(fits_up_to: int = 1 << 30, **options):
    """The fake runtime at LOADED tokens; asked for more, a plan that does not fit past ``fits_up_to``."""

    def planner(record, n_ctx=None):
        n = n_ctx or LOADED
        return Plan(runtime="fake", n_ctx=n, verdict="fits" if n <= fits_up_to else "wont-fit", options=dict(options))

    return planner


@pytest.fixture
def served(build_stack, live_factory, long_gguf):
    def start(**kw):
        stack = build_stack(planner=sized_planner(**kw))
        stack.store.import_path(long_gguf, name="long")
        return stack, live_factory(stack).url

    return start


def chat(url, *, num_ctx=None, text="hi", model="long", stream=False, **options):
    body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
    body["options"] = {"num_predict": 4, **({"num_ctx": num_ctx} if num_ctx else {}), **options}
    return httpx.post(f"{url}/api/chat", json=body, timeout=30)


def loaded_ctx(stack, name="long"):
    return {m["name"]: m["n_ctx"] for m in stack.manager.loaded()}.get(name)


def test_growth_rounds_up_to_a_power_of_two_within_the_trained_context():
    assert grown_context(1000, 65536) == 4096
    assert grown_context(10_692, 65536) == 16_384
    assert grown_context(100_000, 65536) == 65536
    assert grown_context(5000, None) == 8192


def test_aiders_num_ctx_reloads_once_then_never_again(served):
    """aider sends num_ctx = 8192 + 1.25 x prompt on every request: one reload, to 16k, then none."""
    stack, url = served()
    assert chat(url).status_code == 200 and loaded_ctx(stack) == LOADED
    first = stack.manager.load("long").handle
    r = chat(url, num_ctx=8192 + int(1.25 * 2000))
    assert r.status_code == 200, r.text
    assert loaded_ctx(stack) == 16_384
    grown = stack.manager.load("long").handle
    assert grown is not first  # loaded again, with the larger context
    for prompt in (2100, 2200, 1000):  # the next requests fit: no reload, and asking less never shrinks it
        assert chat(url, num_ctx=8192 + int(1.25 * prompt)).status_code == 200
        assert stack.manager.load("long").handle is grown and loaded_ctx(stack) == 16_384


def test_num_ctx_beyond_the_trained_context_is_clamped_not_refused(served):
    stack, url = served()
    r = chat(url, num_ctx=1_000_000)
    assert r.status_code == 200, r.text
    assert loaded_ctx(stack) == 65536


def test_num_ctx_that_does_not_fit_in_memory_takes_the_most_that_fits(served, caplog):
    stack, url = served(fits_up_to=6000)
    with caplog.at_level("WARNING", logger="localrun.activity"):
        assert chat(url, num_ctx=30_000).status_code == 200
    assert loaded_ctx(stack) == 5888  # the largest multiple of 256 that fits
    assert "options.num_ctx 30,000 clamped to 5,888, the most that fits in memory" in caplog.text


def test_num_ctx_that_cannot_grow_at_all_keeps_the_model_and_says_how(served, caplog):
    stack, url = served(fits_up_to=LOADED)
    with caplog.at_level("WARNING", logger="localrun.activity"):
        assert chat(url, num_ctx=30_000).status_code == 200
    assert loaded_ctx(stack) == LOADED
    assert 'does not fit in memory: long kept at 2,048 tokens (start the server with --ctx or set [models."long"]' in (
        caplog.text
    )


def test_a_reload_waits_for_the_request_in_flight_and_queues_the_next_behind_it(served):
    stack, url = served(fake_delay_s=0.05)
    answers: dict[str, httpx.Response] = {}

    def slow():
        answers["slow"] = chat(url, stream=False, num_predict=20)

    first = threading.Thread(target=slow)
    first.start()
    deadline = time.monotonic() + 10
    while not stack.manager.loaded() or stack.manager.loaded()[0]["active"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    grow = chat(url, num_ctx=20_000, num_predict=2)
    first.join(30)
    slow_answer = answers["slow"].json()
    assert answers["slow"].status_code == 200 and slow_answer["eval_count"] == 20  # not cut by the reload
    assert slow_answer["done_reason"] == "length"
    assert grow.status_code == 200 and loaded_ctx(stack) == 32_768


def test_an_overflow_error_names_the_option_that_fixes_it(served):
    stack, url = served()
    long_prompt = " ".join(["word"] * 3000)  # the fake tokenizer: one token a word
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "long", "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 2},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert 'start the server with --ctx 4096 or set [models."long"] ctx = 4096 in config.toml' in message
    r = httpx.post(
        f"{url}/v1/messages",
        json={"model": "long", "max_tokens": 2, "messages": [{"role": "user", "content": long_prompt}]},
        timeout=30,
    )
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith("prompt is too long: ") and "> 2047 maximum (start the server with --ctx 4096" in message


def test_an_overflow_beyond_the_trained_context_says_so(build_stack, live_factory):
    stack = build_stack()  # "tiny": trained on 256 tokens, loaded at 2048 by the fake planner
    url = live_factory(stack).url
    r = httpx.post(
        f"{url}/api/generate",
        json={"model": "tiny", "prompt": " ".join(["w"] * 3000), "stream": False, "options": {"num_predict": 1}},
        timeout=30,
    )
    assert r.status_code == 400
    assert "tiny was trained on 256 tokens: shorten the conversation" in r.json()["error"]


def test_a_model_not_loaded_yet_is_loaded_once_with_the_larger_context(served, monkeypatch):
    stack, url = served()
    starts = []
    real = stack.manager.start_handle
    monkeypatch.setattr(
        stack.manager, "start_handle", lambda record, plan: starts.append(plan.n_ctx) or real(record, plan)
    )
    assert chat(url, num_ctx=10_000).status_code == 200
    assert starts == [16_384] and loaded_ctx(stack) == 16_384
