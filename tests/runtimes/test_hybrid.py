"""Hybrid and recurrent models in the real llama.cpp runtime: the tiny LFM2 (attention beside
short convolutions) and Mamba2 (recurrent only) fixtures of tests/support/hybrid.py, and Gemma 3
270M with a window-sized sliding-window cache (``swa_full: False``).

Their memory cannot be cut back to an arbitrary prefix, so without checkpoints
(runtimes/llamacpp/cache/checkpoints.py) every turn of a conversation prefilled it all again. Here a
10-turn conversation prefills only what the newest checkpoint cannot cover (counted from usage:
prompt_tokens - cached_tokens), and its greedy answers equal a cache-free run's.
"""

from __future__ import annotations

import pytest

from localrun.runtimes.llamacpp.cache.checkpoints import TAIL
from tests.batching.conftest import load, request, run
from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

SYSTEM = "you are a helpful hello world assistant and the time is now " * 6


@pytest.fixture(scope="module", params=["lfm2", "mamba2"])
def fixture(request):
    from tests.support import hybrid

    return request.param, (hybrid.lfm2_path if request.param == "lfm2" else hybrid.mamba2_path)()


def conversation(session, turns: int = 10, *, max_tokens: int = 12) -> list[tuple[str, int, int]]:
    """(answer, prompt tokens, cached tokens) per turn; each turn's prompt carries the answers so far."""
    messages = [("system", SYSTEM)]
    out = []
    for t in range(turns):
        messages.append(("user", f"turn {t}: hello the world is big and what time is it " * 2))
        r = run(session, request(list(messages), max_tokens=max_tokens))
        out.append((r.text, r.usage.prompt_tokens, r.usage.cached_tokens))
        messages.append(("assistant", r.text))
    return out


def test_the_fixtures_load_generate_and_say_what_their_memory_is(fixture):
    import llama_cpp

    name, path = fixture
    s = load(path, n_slots=1, slot_ctx=512)
    try:
        assert s.memory == {"lfm2": "hybrid", "mamba2": "recurrent"}[name]
        assert bool(llama_cpp.llama_model_is_hybrid(s._model)) is (name == "lfm2")
        assert bool(llama_cpp.llama_model_is_recurrent(s._model)) is (name == "mamba2")
        assert s.speculative == "off"  # a rejected draft cannot be taken back out of the state
        r = run(s, request("hello world", max_tokens=8))
        assert r.usage.completion_tokens == 8 and r.text
    finally:
        s.close()


def test_a_ten_turn_conversation_prefills_only_what_checkpoints_cannot_cover(fixture):
    _, path = fixture
    hot = load(path, n_slots=2, slot_ctx=2048, step_tokens=64)
    try:
        got = conversation(hot)
        stats = hot._sched.cache.stats()
    finally:
        hot.close()
    cold = load(path, n_slots=2, slot_ctx=2048, step_tokens=64, prefix_cache=False)
    try:
        want = conversation(cold)
    finally:
        cold.close()
    assert [a for a, _, _ in got] == [a for a, _, _ in want]
    assert got[0][2] == 0
    for (_, before, _), (_, prompt, cached) in zip(got, got[1:]):
        # At least the previous prompt (its end checkpoint) comes from the cache; what is prefilled
        # is the previous answer as rendered and the new user turn, ~75 of up to ~800 tokens.
        assert cached >= before, (before, prompt, cached)
    assert stats.checkpoint_restores >= 9 and 0 < stats.checkpoints <= 2 * 8


def test_a_repeated_prompt_reuses_all_but_the_tail(fixture):
    _, path = fixture
    s = load(path, n_slots=1, slot_ctx=1024)
    try:
        prompt = "hello the world is big " * 20
        first = run(s, request(prompt, max_tokens=6))
        again = run(s, request(prompt, max_tokens=6))
    finally:
        s.close()
    assert again.text == first.text
    assert again.usage.cached_tokens == again.usage.prompt_tokens - TAIL


def test_checkpoints_zero_reuses_no_partial_prefix(fixture):
    _, path = fixture
    s = load(path, n_slots=1, slot_ctx=2048, checkpoints=0)
    try:
        got = conversation(s, turns=3)
        assert s._sched.cache.stats().checkpoints == 0
    finally:
        s.close()
    # Only a prompt that covers the slot's whole content (prompt + answer as sampled) is reused.
    assert all(cached == 0 or cached > before for (_, before, _), (_, _, cached) in zip(got, got[1:]))


def test_a_model_that_can_cut_takes_no_checkpoints(tiny_gguf):
    s = load(tiny_gguf, n_slots=1, slot_ctx=1024)
    try:
        assert s.memory is None and s._sched._ckpt is None
        conversation(s, turns=2)
        assert s._sched.cache.stats().checkpoints == 0
    finally:
        s.close()
