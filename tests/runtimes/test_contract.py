"""The runtime contract, run on every runtime importable here: the fake always, llama.cpp
when llama-cpp-python is installed (on the tiny random-weight GGUF)."""

from __future__ import annotations

import re

import pytest

from localrun.errors import ContextOverflow, RuntimeUnavailable
from localrun.runtimes import get_runtime
from localrun.runtimes.base import Session
from localrun.types import Cancel, ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling
from tests.conftest import needs_llama
from tests.factories import DEFAULT_TINY_TEMPLATE

N_CTX = 256
RUNTIMES = [
    pytest.param("fake", id="fake"),
    pytest.param("llama.cpp", id="llama.cpp", marks=[needs_llama, pytest.mark.llama]),
]


def _load(runtime: str, path, *, template: str | None = DEFAULT_TINY_TEMPLATE):
    metadata = {"tokenizer.chat_template": template} if template else {}
    record = ModelRecord(name="tiny", format=Format.GGUF, path=str(path), metadata=metadata)
    return get_runtime(runtime).load(record, Plan(runtime=runtime, n_ctx=N_CTX, n_threads=2, n_batch=64))


@pytest.fixture(params=RUNTIMES)
def session(request, tiny_gguf):
    s = _load(request.param, tiny_gguf)
    yield s
    s.close()


def _complete(s, prompt="hello", cancel=None, **sampling):
    sampling.setdefault("temperature", 0.0)
    return list(s.complete(CompletionRequest(prompt=prompt, sampling=Sampling(**sampling)), cancel or Cancel()))


def _chat(s, *texts, **sampling):
    sampling.setdefault("temperature", 0.0)
    msgs = tuple(Message("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts))
    return list(s.chat(ChatRequest(messages=msgs, sampling=Sampling(**sampling)), Cancel()))


def _text(chunks) -> str:
    return "".join(c.text for c in chunks)


def test_session_follows_the_protocol(session):
    assert isinstance(session, Session)
    assert isinstance(session.capabilities, frozenset)


@pytest.mark.parametrize("kind", ["complete", "chat"])
def test_streams_chunks_and_ends_with_finish_reason_and_usage(session, kind):
    chunks = (
        _complete(session, "hello world", max_tokens=12)
        if kind == "complete"
        else _chat(session, "hello world", max_tokens=12)
    )
    assert len(chunks) >= 2
    assert all(c.finish_reason is None and c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason in ("stop", "length")
    assert last.usage.prompt_tokens > 0
    assert 0 < last.usage.completion_tokens <= 12
    assert _text(chunks)


def test_max_tokens_is_respected(session):
    last = _complete(session, "hello", max_tokens=5)[-1]
    assert (last.finish_reason, last.usage.completion_tokens) == ("length", 5)


def test_greedy_is_deterministic(session):
    assert _text(_complete(session, "hello world", max_tokens=16)) == _text(
        _complete(session, "hello world", max_tokens=16)
    )
    assert _text(_chat(session, "the time", max_tokens=16)) == _text(_chat(session, "the time", max_tokens=16))


def test_seed_reproduces_a_sampled_answer(session):
    runs = {
        seed: [_text(_complete(session, "hello", max_tokens=16, temperature=1.0, seed=seed)) for _ in range(2)]
        for seed in (7, 8)
    }
    assert runs[7][0] == runs[7][1]
    assert runs[8][0] == runs[8][1]
    assert runs[7][0] != runs[8][0]


def test_stop_string_cuts_the_answer(session):
    full = _text(_complete(session, "hello", max_tokens=24))
    # A 3-character stop from the middle of the answer, first seen there; it may span tokens.
    k = next(
        k for k in range(len(full) // 3, len(full) - 3) if full[k : k + 3].strip() and full.find(full[k : k + 3]) == k
    )
    chunks = _complete(session, "hello", max_tokens=24, stop=("zzzz-never", full[k : k + 3]))
    assert chunks[-1].finish_reason == "stop"
    assert _text(chunks) == full[:k]


def test_cancel_stops_within_one_step(session):
    cancel = Cancel()
    stream = session.complete(
        CompletionRequest(prompt="hello", sampling=Sampling(max_tokens=200, temperature=0.0)), cancel
    )
    seen = [next(stream) for _ in range(3)]
    assert all(c.finish_reason is None for c in seen)
    cancel.set()
    last = next(stream)
    assert last.finish_reason == "cancelled"
    assert last.usage.completion_tokens < 200
    with pytest.raises(StopIteration):
        next(stream)


def test_cancel_before_start_generates_nothing(session):
    cancel = Cancel()
    cancel.set()
    chunks = _complete(session, "hello", cancel=cancel, max_tokens=50)
    assert [c.finish_reason for c in chunks] == ["cancelled"]
    assert chunks[-1].usage.completion_tokens == 0


def test_overlong_prompt_is_context_overflow_naming_both_numbers(session):
    with pytest.raises(ContextOverflow) as info:
        _complete(session, "hello world " * 300, max_tokens=4)
    numbers = [int(n) for n in re.findall(r"\d+", info.value.message)]
    assert N_CTX in numbers and any(n > N_CTX for n in numbers)


def test_max_tokens_is_capped_by_the_context(session):
    prompt = "hello " * 150
    last = _complete(session, prompt, max_tokens=10_000)[-1]
    assert last.finish_reason in ("length", "stop")
    assert last.usage.prompt_tokens + last.usage.completion_tokens <= N_CTX


def test_prefix_reuse_gives_the_same_greedy_answer(session):
    cold = _chat(session, "hello world", "the time", "what was that")
    assert cold[-1].usage.cached_tokens == 0  # the first request of this session
    _chat(session, "hello world", "something else")  # shares the first turn only
    warm = _chat(session, "hello world", "the time", "what was that")
    assert warm[-1].usage.cached_tokens > 0
    assert warm[-1].usage.cached_tokens < warm[-1].usage.prompt_tokens
    assert _text(warm) == _text(cold)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_chat_without_a_template_uses_the_fallback(runtime, tiny_gguf_no_template):
    s = _load(runtime, tiny_gguf_no_template, template=None)
    try:
        chunks = _chat(s, "hello world", max_tokens=8)
        assert chunks[-1].finish_reason in ("stop", "length")
        # the transcript "User: hello world\nAssistant:" is at least four tokens in any vocabulary here
        assert chunks[-1].usage.prompt_tokens >= 4
    finally:
        s.close()


def test_closed_session_refuses_requests(session):
    session.close()
    session.close()  # idempotent
    with pytest.raises(RuntimeUnavailable):
        _complete(session, "hello", max_tokens=2)
