"""The prefix cache's books and decisions, against a stand-in for llama.cpp's KV operations.

The stand-in keeps each sequence's "KV" as a token list, so every test can check the
invariant that matters: a slot's ``tokens`` always equal what its sequence really holds.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localrun.runtimes.llamacpp.cache.host_tier import HOST_MIN_TOKENS
from localrun.runtimes.llamacpp.cache.prefix import KEEP_TAIL, MIN_COPY, PrefixCache
from localrun.runtimes.llamacpp.cache.radix import RadixIndex


class FakeKv:
    """KV memory as token lists, recording the calls."""

    def __init__(self, n: int, *, window_ok: bool = True, rm_ok: bool = True) -> None:
        self.kv: dict[int, list[int]] = {s: [] for s in range(n)}
        self.calls: list[tuple] = []
        self.window, self.rm_ok = window_ok, rm_ok

    def clear(self, seq):
        self.calls.append(("clear", seq))
        self.kv[seq] = []

    def truncate(self, seq, keep):
        self.calls.append(("truncate", seq, keep))
        if self.rm_ok:
            del self.kv[seq][keep:]
        return self.rm_ok

    def copy(self, src, dst):
        self.calls.append(("copy", src, dst))
        self.kv[dst] = list(self.kv[src])

    def window_ok(self, seq, keep):
        return self.window

    def save(self, seq):
        self.calls.append(("save", seq))
        return json.dumps(self.kv[seq]).encode()

    def restore(self, seq, blob):
        self.calls.append(("restore", seq))
        self.kv[seq] = json.loads(blob)
        return True


def run(cache: PrefixCache, kv: FakeKv, prompt: list[int], answer: list[int] = ()):
    """Acquire a slot, 'prefill' the rest of the prompt and 'decode' an answer, release."""
    slot, keep = cache.acquire(prompt)
    assert slot.tokens == kv.kv[slot.seq] == prompt[:keep]
    slot.tokens.extend(prompt[keep:])
    slot.tokens.extend(answer)
    kv.kv[slot.seq] = list(slot.tokens)
    cache.release(slot)
    return slot, keep


def check(cache: PrefixCache, kv: FakeKv) -> None:
    for slot in cache.slots:
        assert slot.tokens == kv.kv[slot.seq]


SYSTEM = list(range(100, 200))  # a 100-token shared prefix


# --- the radix index --------------------------------------------------------------------------


def test_longest_prefix_and_its_owners():
    idx = RadixIndex()
    idx.set(0, [1, 2, 3, 4])
    idx.set(1, [1, 2, 3, 9, 9])
    idx.set(2, [7])
    assert idx.longest([1, 2, 3]) == (3, {0, 1})
    assert idx.longest([1, 2, 3, 4, 5]) == (4, {0})
    assert idx.longest([1, 2, 3, 9]) == (4, {1})
    assert idx.longest([1, 5]) == (1, {0, 1})
    assert idx.longest([8]) == (0, frozenset())
    assert idx.longest([]) == (0, frozenset())


def test_replacing_and_discarding_prunes_the_tree():
    idx = RadixIndex()
    idx.set(0, [1, 2, 3, 4])
    idx.set(1, [1, 2, 5])
    idx.set(0, [1, 2])  # shrink owner 0
    assert idx.longest([1, 2, 3]) == (2, {0, 1})
    idx.discard(1)
    assert idx.longest([1, 2, 5]) == (2, {0})
    idx.discard(0)
    idx.discard(0)  # twice is fine
    assert idx.node_count() == 1
    assert 0 not in idx


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 3), max_size=12)), max_size=30),
    st.lists(st.integers(0, 3), max_size=12),
)
def test_index_matches_a_brute_force_search(ops, query):
    idx, held = RadixIndex(), {}
    for owner, tokens in ops:
        if tokens and tokens[0] == 3:  # a discard now and then
            idx.discard(owner)
            held.pop(owner, None)
        else:
            idx.set(owner, tokens)
            if tokens:
                held[owner] = tokens
            else:
                held.pop(owner, None)

    def common(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    best = max((common(t, query) for t in held.values()), default=0)
    owners = {o for o, t in held.items() if common(t, query) == best} if best else set()
    assert idx.longest(query) == (best, owners)
    for limit in (len(query), max(0, len(query) - 2)):  # saved states that the query covers whole
        whole = [len(t) for t in held.values() if len(t) <= limit and query[: len(t)] == t]
        longest = max(whole, default=0)
        enders = {o for o, t in held.items() if len(t) == longest and query[:longest] == t} if longest else set()
        assert idx.whole(query, limit) == (longest, enders)
    for owner in list(held):
        idx.discard(owner)
    assert idx.node_count() == 1


# --- slots ----------------------------------------------------------------------------------------


def test_empty_slots_are_taken_lowest_first_and_all_busy_means_wait():
    kv = FakeKv(2)
    cache = PrefixCache(2, kv)
    a, _ = cache.acquire([1, 2, 3])
    b, _ = cache.acquire([4, 5, 6])
    assert (a.seq, b.seq) == (0, 1)
    assert cache.acquire([7]) is None
    assert cache.free_slots() == 0


def test_a_shared_prefix_is_reused_in_place_and_the_tail_dropped():
    kv = FakeKv(1)
    cache = PrefixCache(1, kv)
    run(cache, kv, SYSTEM + [1, 2, 3], answer=[50, 51])
    slot, keep = run(cache, kv, SYSTEM + [9, 9, 9])
    assert keep == len(SYSTEM)
    assert ("truncate", 0, len(SYSTEM)) in kv.calls
    check(cache, kv)


def test_an_identical_prompt_leaves_min_tail_tokens_to_evaluate():
    for min_tail in (1, 8):
        kv = FakeKv(1)
        cache = PrefixCache(1, kv, min_tail=min_tail)
        run(cache, kv, SYSTEM)
        _, keep = run(cache, kv, SYSTEM)
        assert keep == len(SYSTEM) - min_tail


def test_a_prefix_shorter_than_min_tail_is_not_reused():
    kv = FakeKv(1)
    cache = PrefixCache(1, kv, min_tail=8)
    run(cache, kv, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    _, keep = run(cache, kv, [1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    assert keep == 0
    check(cache, kv)


def test_a_busy_slots_prefix_is_copied_into_another_slot():
    kv = FakeKv(2)
    cache = PrefixCache(2, kv)
    busy, _ = cache.acquire(SYSTEM + [1])
    busy.tokens.extend(SYSTEM + [1])
    kv.kv[0] = list(busy.tokens)
    cache.extended(busy)  # a prefill chunk landed: the prompt is reusable while it runs
    slot, keep = cache.acquire(SYSTEM + [2])
    assert (slot.seq, keep) == (1, len(SYSTEM))
    assert ("copy", 0, 1) in kv.calls and kv.kv[0] == SYSTEM + [1]
    check(cache, kv)


def test_an_idle_conversation_is_copied_from_rather_than_cut_when_a_slot_is_empty():
    kv = FakeKv(2)
    cache = PrefixCache(2, kv)
    run(cache, kv, SYSTEM + [1], answer=list(range(KEEP_TAIL)))
    slot, keep = run(cache, kv, SYSTEM + [2])
    assert (slot.seq, keep) == (1, len(SYSTEM))
    assert cache.slots[0].tokens == SYSTEM + [1] + list(range(KEEP_TAIL))  # the conversation survives
    check(cache, kv)


def test_the_least_recently_used_idle_slot_is_evicted():
    kv = FakeKv(2)
    cache = PrefixCache(2, kv)
    run(cache, kv, [1] * 50)  # slot 0, used first
    run(cache, kv, [2] * 50)  # slot 1
    slot, keep = run(cache, kv, [3] * 50)
    assert (slot.seq, keep) == (0, 0)
    assert cache.index.longest([2] * 50)[1] == {1}
    check(cache, kv)


def test_victims_keep_busy_slots_together_among_the_older_ones():
    """llama.cpp decodes consecutive busy sequences in one pass; each gap costs another."""
    kv = FakeKv(4)
    cache = PrefixCache(4, kv)
    for seq in (0, 2, 1, 3):  # release order: slot 0 is the oldest, then 2, 1, 3
        slot = cache.slots[seq]
        slot.tokens[:] = kv.kv[seq] = [seq * 100 + i for i in range(50)]
        cache.release(slot)
    a, _ = cache.acquire([7] * 40)
    b, _ = cache.acquire([8] * 40)
    assert (a.seq, b.seq) == (0, 1)  # pure LRU would take 0 then 2: two passes per step
    assert cache.index.longest([300 + i for i in range(50)])[0] == 50  # the newest content survives
    assert cache.index.longest([100 + i for i in range(50)]) == (50, {2})  # slot 1's moved aside…
    assert cache.index.longest([200 + i for i in range(50)])[0] == 0  # …over the least recently used
    assert ("copy", 1, 2) in kv.calls and cache.stats().relocated == 1
    check(cache, kv)


def test_an_overwritten_window_or_an_uncuttable_sequence_means_a_full_prefill():
    for kv in (FakeKv(1, window_ok=False), FakeKv(1, rm_ok=False)):
        cache = PrefixCache(1, kv)
        run(cache, kv, SYSTEM + [1])
        slot, keep = cache.acquire(SYSTEM + [2])
        assert keep == 0 and slot.tokens == [] and kv.kv[0] == []
        assert kv.calls[-1] == ("clear", 0)


def test_small_prefixes_are_not_copied_between_slots():
    kv = FakeKv(2)
    cache = PrefixCache(2, kv)
    busy, _ = cache.acquire(list(range(MIN_COPY - 1)) + [9])
    busy.tokens.extend(list(range(MIN_COPY - 1)) + [9])
    kv.kv[0] = list(busy.tokens)
    cache.extended(busy)
    _, keep = cache.acquire(list(range(MIN_COPY - 1)) + [8])
    assert keep == 0 and not any(c[0] == "copy" for c in kv.calls)


def test_drop_forgets_a_slot():
    kv = FakeKv(1)
    cache = PrefixCache(1, kv)
    slot, _ = cache.acquire(SYSTEM)
    slot.tokens.extend(SYSTEM)
    cache.extended(slot)
    cache.drop(slot)
    assert not slot.busy and slot.tokens == [] and cache.index.longest(SYSTEM) == (0, frozenset())


# --- the host-RAM tier --------------------------------------------------------------------


def test_an_evicted_prefix_is_saved_to_host_ram_and_restored():
    kv = FakeKv(1)
    cache = PrefixCache(1, kv, host_budget=1 << 20)
    long_a = SYSTEM + list(range(HOST_MIN_TOKENS))
    run(cache, kv, long_a, answer=[7, 7])
    run(cache, kv, [5] * 80)  # evicts A: saved first
    assert cache.stats().saved == 1 and cache.stats().host_entries == 1
    slot, keep = run(cache, kv, long_a + [7, 7, 1, 2, 3])
    assert keep == len(long_a) + 2  # the saved answer too
    assert ("restore", 0) in kv.calls and cache.stats().restored == 1
    check(cache, kv)


def test_host_ram_keeps_to_its_budget_least_recently_used_first():
    kv = FakeKv(1)
    one = len(json.dumps(list(range(300, 300 + HOST_MIN_TOKENS))).encode())
    cache = PrefixCache(1, kv, host_budget=int(one * 2.5))
    prompts = [list(range(k * 1000, k * 1000 + HOST_MIN_TOKENS)) for k in range(4)]
    for p in prompts:
        run(cache, kv, p)
    run(cache, kv, [1] * 10)
    assert cache.stats().host_entries == 2
    assert cache.host.bytes <= int(one * 2.5)
    assert cache.index.longest(prompts[0])[0] == 0  # the oldest went
    assert cache.index.longest(prompts[3])[0] == HOST_MIN_TOKENS


def test_content_another_owner_holds_is_not_saved_again():
    kv = FakeKv(2)
    cache = PrefixCache(2, kv, host_budget=1 << 20)
    p = SYSTEM + list(range(HOST_MIN_TOKENS))
    run(cache, kv, p)  # slot 0
    run(cache, kv, [4] * 70)  # slot 1
    run(cache, kv, [5] * 70)  # evicts slot 0 → saved
    run(cache, kv, p + [1])  # restored into slot 1 (LRU)
    run(cache, kv, [6] * 70)  # evicts slot 0 ([5]*70), saved; slot 1 still holds p
    saved = cache.stats().saved
    run(cache, kv, [7] * 70)  # evicts slot 1 (p + [1]): its prefix p is in host RAM, but p+[1] is new
    assert cache.stats().saved == saved + 1
    check(cache, kv)


@pytest.mark.parametrize("seed", range(5))
def test_random_workload_keeps_the_books_straight(seed):
    import random

    rng = random.Random(seed)
    kv = FakeKv(3)
    cache = PrefixCache(3, kv, min_tail=8, host_budget=1 << 16)
    heads = [list(range(k * 100, k * 100 + 90)) for k in range(4)]
    running = []
    for _ in range(200):
        if running and (rng.random() < 0.5 or cache.free_slots() == 0):
            slot = running.pop(rng.randrange(len(running)))
            slot.tokens.extend(rng.randrange(1000) for _ in range(rng.randrange(5)))
            kv.kv[slot.seq] = list(slot.tokens)
            cache.release(slot)
        else:
            prompt = rng.choice(heads)[: rng.randrange(1, 90)] + [
                rng.randrange(1000) for _ in range(rng.randrange(1, 30))
            ]
            slot, keep = cache.acquire(prompt)
            assert slot.tokens == kv.kv[slot.seq] == prompt[:keep]
            assert keep == 0 or keep >= 8
            slot.tokens.extend(prompt[keep:])
            kv.kv[slot.seq] = list(slot.tokens)
            running.append(slot)
        check(cache, kv)
        assert cache.host.bytes <= 1 << 16
