"""Continuous batching on real llama.cpp contexts: the tiny random-weight GGUF (near-uniform
logits, so the slightest arithmetic difference flips a greedy token) and Gemma 3 270M.

The reference for "same tokens" is a session with the prefix cache off running each request
alone: every prompt prefilled cold, nothing else in the context. Batched answers must match
it in the default (batch-invariant) layout; answers whose prompt prefix came from the cache
must match it with ``exact_prefix`` (see llamacpp/cache/slots.py for why that is opt-in).
"""

from __future__ import annotations

import threading

import pytest

from localrun.errors import ContextOverflow, RuntimeUnavailable
from localrun.runtimes.llamacpp.cache.prefix import MIN_REUSE
from localrun.runtimes.llamacpp.cache.slots import MIN_CHUNK
from localrun.types import Cancel
from tests.batching.conftest import assert_idle, load, request, run, together
from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]

TINY_PROMPTS = [
    "hello world",
    "the time is now",
    "hello hello hello the world is big " * 3,
    "a b c d e f g",
    "what was that",
    "hello the time " * 9,
    "zebra",
    "world time hello what " * 7,
]
GEMMA_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a land far away, there lived a young girl who loved to read old books by candlelight. One "
    "day",
    "def fibonacci(n):",
    "Here is a list of numbers that keeps going: 1, 2, 3, 4, 5, 6, 7,",
    "The three primary colors are",
    "In 1969, the first humans to walk on the Moon were",
    "Recipe for a simple tomato soup. Ingredients: tomatoes, onion, garlic, olive oil, salt. Steps: 1.",
    "A haiku about the sea:\n",
]
TINY_SYSTEM = "you are a helpful hello world assistant and the time is now " * 4
GEMMA_SYSTEM = (
    "You are a careful assistant. Answer briefly and precisely, in plain English, and say when you do not know. "
) * 8


@pytest.fixture(params=["tiny", pytest.param("gemma", marks=pytest.mark.gemma)])
def model(request):
    if request.param == "tiny":
        return request.param, request.getfixturevalue("tiny_gguf"), TINY_PROMPTS, TINY_SYSTEM, 32
    return request.param, request.getfixturevalue("gemma_gguf"), GEMMA_PROMPTS, GEMMA_SYSTEM, 20


EXACT = {"exact_prefix": True}


def _references(path, prompts, max_tokens, **opts):
    cold = load(path, n_slots=1, slot_ctx=256 if "tiny" in str(path) else 512, prefix_cache=False, **opts)
    try:
        return {p: run(cold, request(p, max_tokens=max_tokens)).text for p in prompts}
    finally:
        cold.close()


def test_greedy_tokens_are_the_same_alone_and_batched_by_default(model):
    name, path, prompts, _, max_tokens = model
    ref = _references(path, prompts, max_tokens)
    assert len(set(ref.values())) > len(prompts) // 2  # the prompts really lead different ways
    s = load(path, n_slots=4, slot_ctx=256 if name == "tiny" else 512, step_tokens=32, prefix_cache=False)
    assert s.layout.exact and not s.layout.exact_prefix  # the default: batch-invariant, flash attention on
    try:
        for others in (1, 3):
            group = [prompts[0], *prompts[1 : 1 + others]]
            got = together(s, [request(p, max_tokens=max_tokens) for p in group])
            assert [r.text for r in got] == [ref[p] for p in group], f"batched with {others} others"
        got = together(s, [request(p, max_tokens=max_tokens) for p in prompts])  # 8 requests, 4 slots
        assert [r.text for r in got] == [ref[p] for p in prompts]
        assert_idle(s)
    finally:
        s.close()
    # 8 slots are past the default's batch-invariant range (it gives way to the 8-row kernels): ask for it
    s = load(
        path,
        n_slots=8,
        slot_ctx=256 if name == "tiny" else 512,
        step_tokens=32,
        prefix_cache=False,
        batch_invariant=True,
    )
    try:
        assert s.layout.decode_rows == 7
        got = together(s, [request(p, max_tokens=max_tokens) for p in prompts])
        assert [r.text for r in got] == [ref[p] for p in prompts], "batched with 7 others"
    finally:
        s.close()


def test_greedy_tokens_are_the_same_alone_batched_and_from_the_cache(model):
    name, path, prompts, _, max_tokens = model
    ref = _references(path, prompts, max_tokens, **EXACT)
    s = load(path, n_slots=8, slot_ctx=256 if name == "tiny" else 512, step_tokens=32, **EXACT)
    assert s.layout.exact and s.layout.decode_rows == 7 and s.layout.min_chunk == 8
    try:
        target = prompts[0]
        for others in (1, 3, 7):  # cold the first time each prompt is seen, then from the cache
            group = [target, *prompts[1 : 1 + others]]
            got = together(s, [request(p, max_tokens=max_tokens) for p in group])
            for p, r in zip(group, got):
                assert r.text == ref[p], f"{p!r} batched with {others} others"
        again = together(s, [request(p, max_tokens=max_tokens) for p in prompts])
        assert [r.text for r in again] == [ref[p] for p in prompts]
        # the longer prompts again, all at once: each one's prefix is still in some slot
        reusable = MIN_REUSE + MIN_CHUNK  # at least 16 tokens reused, 8 evaluated again
        longer = [p for p in prompts if len(s.tokenize(p, add_special=True)) >= reusable]
        assert len(longer) >= 3
        warm = together(s, [request(p, max_tokens=max_tokens) for p in longer])
        assert all(r.usage.cached_tokens >= r.usage.prompt_tokens - 8 for r in warm)
        assert [r.text for r in warm] == [ref[p] for p in longer]
        assert_idle(s)
    finally:
        s.close()


def test_a_shared_system_prompt_is_reused_and_changes_nothing(model):
    name, path, prompts, system, max_tokens = model
    chats = [[("system", system), ("user", p)] for p in prompts[:4]]
    cold = load(path, n_slots=1, slot_ctx=512, prefix_cache=False, **EXACT)
    try:
        ref = [run(cold, request(c, max_tokens=max_tokens)) for c in chats]
    finally:
        cold.close()
    s = load(path, n_slots=4, slot_ctx=512, step_tokens=32, **EXACT)
    try:
        first = run(s, request(chats[0], max_tokens=max_tokens))  # fills slot 0
        assert first.text == ref[0].text and first.usage.cached_tokens == 0
        # three at once: the system prompt comes from slot 0 (idle) into the others
        rest = together(s, [request(c, max_tokens=max_tokens) for c in chats[1:]])
        system_tokens = ref[0].usage.prompt_tokens - 20
        for r, want in zip(rest, ref[1:]):
            assert r.text == want.text
            assert r.usage.cached_tokens >= system_tokens
        stats = s._sched.cache.stats()
        assert stats.copied + stats.reused_in_place >= 3
        assert_idle(s)
    finally:
        s.close()


def test_a_prefix_is_copied_from_a_slot_that_is_still_running(model):
    """Two requests with one long system prompt, the second arriving while the first prefills."""
    name, path, prompts, system, max_tokens = model
    chats = [[("system", system * 2), ("user", p)] for p in prompts[:2]]
    cold = load(path, n_slots=1, slot_ctx=512, prefix_cache=False, **EXACT)
    try:
        # the first answer runs to the end of its slot, so it is still decoding when the
        # second arrives however fast this machine is (else the second takes its slot in place)
        ref = [run(cold, request(c, max_tokens=m)).text for c, m in zip(chats, (None, max_tokens))]
    finally:
        cold.close()
    s = load(path, n_slots=2, slot_ctx=512, step_tokens=16, **EXACT)
    try:
        results: list = [None]
        first = s.chat(request(chats[0], max_tokens=None), Cancel())
        t = threading.Thread(target=lambda: results.__setitem__(0, list(first)))
        t.start()
        sched = s._sched
        import time

        deadline = time.monotonic() + 60
        while not sched.cache.slots[0].tokens and time.monotonic() < deadline:
            time.sleep(0.002)  # wait for the first chunk of the first prompt
        second = run(s, request(chats[1], max_tokens=max_tokens))
        t.join(120)
        assert "".join(c.text for c in results[0]) == ref[0]
        assert second.text == ref[1]
        assert second.usage.cached_tokens >= 16
        assert s._sched.cache.stats().copied >= 1
        assert_idle(s)
    finally:
        s.close()


def test_each_request_keeps_its_own_sampling(model):
    """Seeded sampling, stop strings and max_tokens per request, all running together."""
    name, path, prompts, _, _ = model
    reqs = [
        request(prompts[0], temperature=0.9, seed=1, max_tokens=20),
        request(prompts[1], temperature=1.2, top_p=0.8, seed=2, max_tokens=20),
        request(prompts[2], temperature=0.0, max_tokens=7),
        request(prompts[3], temperature=0.7, top_k=5, seed=3, max_tokens=20),
    ]
    s = load(path, n_slots=4, slot_ctx=256, prefix_cache=False)
    try:
        alone = [run(s, r) for r in reqs]
        full = alone[2].text
        k = next(
            (k for k in range(2, len(full) - 2) if full[k : k + 2].strip() and full.find(full[k : k + 2]) == k), None
        )
        if k is not None:  # a stop string from the middle of the greedy answer
            reqs[2] = request(prompts[2], temperature=0.0, max_tokens=7, stop=(full[k : k + 2],))
            alone[2] = run(s, reqs[2])
            assert alone[2].text == full[:k] and alone[2].finish == "stop"
        batched = together(s, reqs)
        assert [r.text for r in batched] == [r.text for r in alone]
        assert [r.finish for r in batched] == [r.finish for r in alone]
        assert batched[1].usage.completion_tokens <= 20
        assert_idle(s)
    finally:
        s.close()


def test_cancelling_one_of_four_streams_leaves_the_others_right_and_frees_its_slot(model):
    name, path, prompts, _, _ = model
    ref = _references(path, prompts[:4], 40, **EXACT)
    s = load(path, n_slots=4, slot_ctx=256, **EXACT)
    try:
        cancels = [Cancel() for _ in range(4)]
        out: list = [None] * 4

        def one(i):
            chunks = []
            for chunk in s.complete(request(prompts[i], max_tokens=40), cancels[i]):
                chunks.append(chunk)
                if i == 2 and len(chunks) == 3:
                    cancels[i].set()
            out[i] = chunks

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        cancelled = out[2]
        assert cancelled[-1].finish_reason == "cancelled"
        assert cancelled[-1].usage.completion_tokens < 40
        for i in (0, 1, 3):
            assert "".join(c.text for c in out[i]) == ref[prompts[i]]
        assert_idle(s)
        # its slot is usable again: four more requests run at once
        again = together(s, [request(p, max_tokens=40) for p in prompts[:4]])
        assert [r.text for r in again] == [ref[p] for p in prompts[:4]]
        assert_idle(s)
    finally:
        s.close()


def test_a_request_longer_than_its_slot_is_context_overflow(tiny_gguf):
    s = load(tiny_gguf, n_slots=4, slot_ctx=64)
    try:
        assert s.n_ctx == 64
        with pytest.raises(ContextOverflow, match=r"64") as info:
            list(s.complete(request("hello world " * 40), Cancel()))
        assert "slot" in info.value.message
        fits = next(p for p in ("hello" + " the" * k for k in range(80)) if len(s.tokenize(p, add_special=True)) == 60)
        last = run(s, request(fits, max_tokens=50))
        assert (last.finish, last.usage.completion_tokens) == ("length", 4)
        assert_idle(s)
    finally:
        s.close()


def test_more_requests_than_slots_wait_their_turn_and_nothing_leaks(tiny_gguf):
    s = load(tiny_gguf, n_slots=2, slot_ctx=256)
    try:
        results = together(s, [request(p, max_tokens=12) for p in TINY_PROMPTS])
        assert all(r.finish in ("length", "stop") for r in results)
        # abandoned generators (a client that went away) free their slots too
        streams = [s.complete(request(p, max_tokens=200), Cancel()) for p in TINY_PROMPTS[:2]]
        for st in streams:
            next(st)
            st.close()
        assert_idle(s)
        assert run(s, request("hello", max_tokens=3)).usage.completion_tokens == 3
    finally:
        s.close()


def test_an_evicted_prefix_comes_back_from_host_ram(tiny_gguf):
    long_prompt = "hello the world is big and the time is now " * 6
    ref = _references(tiny_gguf, [long_prompt], 16, **EXACT)[long_prompt]
    s = load(tiny_gguf, n_slots=1, slot_ctx=256, host_cache_mib=16, **EXACT)
    try:
        assert run(s, request(long_prompt, max_tokens=16)).text == ref
        run(s, request("zebra what " * 10, max_tokens=4))  # takes the only slot: the first is saved
        back = run(s, request(long_prompt, max_tokens=16))
        assert back.text == ref
        assert back.usage.cached_tokens >= back.usage.prompt_tokens - 8
        stats = s._sched.cache.stats()
        assert stats.saved >= 1 and stats.restored == 1 and stats.host_bytes > 0
    finally:
        s.close()


def test_a_unified_kv_pool_runs_requests_together(tiny_gguf):
    """One pool for all slots: each request may use the whole context (answers are not
    guaranteed bit-identical to a solo run in this layout, see llamacpp/scheduler.py)."""
    s = load(tiny_gguf, n_slots=4, slot_ctx=256, kv_unified=True)
    try:
        assert s.n_ctx == 256 and s.layout.n_ctx == 256
        results = together(s, [request(p, max_tokens=16) for p in TINY_PROMPTS[:4]])
        assert all(r.usage.completion_tokens > 0 for r in results)
        assert_idle(s)
    finally:
        s.close()


def test_close_ends_every_running_stream(tiny_gguf):
    s = load(tiny_gguf, n_slots=2, slot_ctx=256)
    streams = [s.complete(request(p, max_tokens=200), Cancel()) for p in TINY_PROMPTS[:3]]
    firsts = [next(st) for st in streams[:2]]
    assert all(c.finish_reason is None for c in firsts)
    s.close()
    for st in streams[:2]:
        assert list(st)[-1].finish_reason == "cancelled"
    with pytest.raises(RuntimeUnavailable):  # never started: it would join a closed scheduler
        next(streams[2])
    assert s._freed
