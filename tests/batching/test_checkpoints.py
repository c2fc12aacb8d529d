"""The checkpoint policy (runtimes/llamacpp/cache/checkpoints.py) against a stand-in for a recurrent
memory: each sequence has attention KV (a token list, cut anywhere) and a recurrent state (the
tokens it has read), which ``truncate`` cannot take back, as ``llama_memory_seq_rm`` refuses.

The invariant every test checks: a slot's ``tokens`` equal both what its attention KV holds and
what its state has read, i.e. the state is what a cold prefill of those tokens would give.
"""

from __future__ import annotations

import json

import pytest

from localrun.runtimes.llamacpp.cache.checkpoints import TAIL, CheckpointKv, marks, with_checkpoints
from localrun.runtimes.llamacpp.cache.host_tier import HOST_MIN_TOKENS
from localrun.runtimes.llamacpp.cache.leaving import SHORT_ANSWER, leaving_points
from localrun.runtimes.llamacpp.cache.prefix import PrefixCache
from localrun.runtimes.llamacpp.turns import TurnPrompt


class RecurrentKv:
    """KV operations of a hybrid memory, as token lists."""

    def __init__(self, n: int) -> None:
        self.attn: dict[int, list[int]] = {s: [] for s in range(n)}
        self.state: dict[int, list[int]] = {s: [] for s in range(n)}
        self.calls: list[tuple] = []

    def clear(self, seq):
        self.attn[seq], self.state[seq] = [], []

    def truncate(self, seq, keep):
        self.calls.append(("truncate", seq, keep))
        if keep < len(self.state[seq]):
            return False  # a recurrent state cannot be cut back
        del self.attn[seq][keep:]
        return True

    def copy(self, src, dst):
        self.attn[dst], self.state[dst] = list(self.attn[src]), list(self.state[src])

    def window_ok(self, seq, keep):
        return True

    def save(self, seq):
        self.calls.append(("save", seq))
        return json.dumps([self.attn[seq], self.state[seq]]).encode()

    def restore(self, seq, blob):
        self.calls.append(("restore", seq))
        self.attn[seq], self.state[seq] = json.loads(blob)
        return True

    def read(self, seq, tokens):
        """A prefill chunk: both memories read ``tokens``."""
        self.attn[seq].extend(tokens)
        self.state[seq].extend(tokens)


class Partial:
    """LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY on the stand-in: the recurrent state alone."""

    def __init__(self, kv: RecurrentKv) -> None:
        self.kv = kv
        self.fail = False

    def save(self, seq):
        return json.dumps(self.kv.state[seq]).encode()

    def restore(self, seq, blob):
        if self.fail:
            self.kv.state[seq] = [-1]  # a failed restore leaves the state unknown
            return False
        self.kv.state[seq] = json.loads(blob)
        return True


def make(n_slots: int = 2, *, limit: int = 8, interval: int = 2048, host_budget: int = 0):
    kv = RecurrentKv(n_slots)
    partial = Partial(kv)
    ops = CheckpointKv(kv, partial, limit=limit, interval=interval)
    return PrefixCache(n_slots, ops, host_budget=host_budget), ops, kv, partial


def check(cache: PrefixCache, kv: RecurrentKv) -> None:
    for slot in cache.slots:
        assert slot.tokens == kv.attn[slot.seq] == kv.state[slot.seq]


def turn(cache, ops, kv, prompt, answer=(), *, step: int = 64):
    """What the scheduler does with one request: acquire, prefill in chunks (ending where ``clip``
    says, a checkpoint where ``taken_at`` says), decode ``answer``, release. Returns the reused length."""
    slot, keep = cache.acquire(prompt)
    check(cache, kv)
    assert slot.tokens == prompt[:keep]
    start = keep
    while start < len(prompt):
        n = ops.clip(start, min(step, len(prompt) - start), len(prompt), 1, *marks(prompt, slot))
        kv.read(slot.seq, prompt[start : start + n])
        slot.tokens.extend(prompt[start : start + n])
        cache.extended(slot, getattr(prompt, "turn", None))
        ops.taken_at(slot.seq, start + n, len(prompt), *marks(prompt, slot))
        start += n
    for token in answer:
        kv.read(slot.seq, [token])
        slot.tokens.append(token)
    cache.release(slot)
    check(cache, kv)
    return slot, keep


SYSTEM = list(range(1000, 1100))


def test_a_turn_that_extends_the_conversation_restores_the_end_checkpoint():
    cache, ops, kv, _ = make()
    first = SYSTEM + [1, 2, 3]
    slot, _ = turn(cache, ops, kv, first, answer=[7, 8, 9])
    assert ops.positions(slot.seq) == [len(first) - TAIL, len(first)]
    # The client renders the answer differently (as a thinking model's template does): the
    # prompt shares the first turn's prompt, not the slot's end.
    second = first + [70, 80, 90, 4, 5, 6]
    slot2, keep = turn(cache, ops, kv, second)
    assert slot2 is slot and keep == len(first)
    assert ops.restores == 1 and cache.stats().checkpoint_restores == 1


def test_a_repeated_prompt_reuses_all_but_the_tail():
    cache, ops, kv, _ = make()
    prompt = SYSTEM + [1, 2, 3]
    turn(cache, ops, kv, prompt, answer=[7, 8])
    _, keep = turn(cache, ops, kv, prompt)
    assert keep == len(prompt) - TAIL


def test_the_whole_slot_is_reused_without_a_restore_when_the_prompt_covers_it():
    cache, ops, kv, _ = make()
    first = SYSTEM + [1, 2]
    turn(cache, ops, kv, first, answer=[7, 8])
    _, keep = turn(cache, ops, kv, first + [7, 8, 3, 4])
    assert keep == len(first) + 2 and ops.restores == 0


def test_before_checkpoints_a_shared_prefix_was_lost():
    """The regression: a recurrent memory refuses the cut, so nothing was reused."""
    kv = RecurrentKv(1)
    cache = PrefixCache(1, kv)
    prompt = SYSTEM + [1, 2, 3]
    slot, _ = cache.acquire(prompt)
    kv.read(slot.seq, prompt)
    slot.tokens.extend(prompt)
    cache.release(slot)
    _, keep = cache.acquire(SYSTEM + [9, 9, 9])
    assert keep == 0
    cache2, ops, kv2, _ = make(1)
    turn(cache2, ops, kv2, prompt)
    _, keep2 = turn(cache2, ops, kv2, SYSTEM[:80] + [9, 9, 9])
    assert keep2 == 0  # no checkpoint inside the first 80 tokens of a short prefill ...
    cache3, ops3, kv3, _ = make(1, interval=50)
    turn(cache3, ops3, kv3, prompt)
    _, keep3 = turn(cache3, ops3, kv3, SYSTEM[:80] + [9, 9, 9])
    assert keep3 == 50  # ... but one every ``interval`` tokens of a long one


def test_long_prefill_takes_interval_checkpoints_and_a_cut_drops_those_past_it():
    cache, ops, kv, _ = make(1, interval=100)
    prompt = list(range(450))
    slot, _ = turn(cache, ops, kv, prompt, step=64)
    assert ops.positions(slot.seq) == [100, 200, 300, 400, 446, 450]
    edited = prompt[:250] + [9] * 50
    _, keep = turn(cache, ops, kv, edited)
    assert keep == 200
    assert ops.positions(slot.seq)[:2] == [100, 200]  # 300 and up described the old content
    assert 250 in ops.positions(slot.seq)  # where the edit parted from the cached prompt
    assert all(p <= 250 or p >= 296 for p in ops.positions(slot.seq))


def test_at_most_limit_per_sequence_the_least_useful_goes_and_the_newest_end_stays():
    cache, ops, kv, _ = make(1, limit=3, interval=10_000)
    conversation = list(SYSTEM)
    for t in range(6):
        conversation += [t, t, t, t, t, t]
        slot, _ = turn(cache, ops, kv, list(conversation), answer=[50 + t])
        points = ops.positions(slot.seq)
        assert len(points) <= 3
        assert len(conversation) in points  # the newest end checkpoint
    # The tail checkpoints go first: they sit 4 tokens from an end checkpoint.
    assert all(points[i + 1] - points[i] > TAIL for i in range(len(points) - 1))


def test_zero_checkpoints_reuses_only_whole_slots():
    cache, ops, kv, _ = make(1, limit=0)
    turn(cache, ops, kv, SYSTEM + [1, 2])
    assert ops.held() == 0
    _, keep = turn(cache, ops, kv, SYSTEM + [5, 6])
    assert keep == 0


def test_a_copy_carries_the_checkpoints_and_a_clear_drops_them():
    cache, ops, kv, _ = make(2)
    prompt = SYSTEM + list(range(200))
    slot, _ = turn(cache, ops, kv, prompt, answer=list(range(300, 380)))  # a long tail: the next turn copies
    other = prompt + [5, 5, 5]
    busy, _ = cache.acquire(other)  # the idle slot is kept; its prefix copied into the other one
    assert busy is not slot and busy.tokens == prompt and ops.restores == 1
    check(cache, kv)
    cache.release(busy)
    ops.clear(slot.seq)
    assert ops.positions(slot.seq) == []


def test_a_failed_restore_falls_back_to_an_older_checkpoint_or_a_cold_prefill():
    cache, ops, kv, partial = make(1, interval=50)
    prompt = SYSTEM + [1, 2, 3]
    slot, _ = turn(cache, ops, kv, prompt)
    partial.fail = True
    _, keep = turn(cache, ops, kv, SYSTEM[:80] + [9, 9, 9])
    assert keep == 0  # every restore failed: the slot was cleared and prefilled cold
    check(cache, kv)


def test_host_entries_are_reused_only_when_the_prompt_covers_them_whole():
    cache, ops, kv, _ = make(1, host_budget=1 << 20)
    a = list(range(HOST_MIN_TOKENS + 10))
    answer = list(range(900, 900 + SHORT_ANSWER + 4))  # longer than a few tokens: the whole is kept too
    turn(cache, ops, kv, a, answer=answer)
    turn(cache, ops, kv, [5] * 40)  # a evicted to host RAM: whole, and at its tail checkpoint
    assert cache.stats().host_entries == 2
    kv.calls.clear()
    _, keep = turn(cache, ops, kv, a[:-5] + [1, 2, 3, 4, 5, 6])  # shares a's prefix, not all of it
    assert keep == 0 and ("restore", 0) not in kv.calls  # before: restored, then the cut failed
    turn(cache, ops, kv, [6] * 40)
    _, keep = turn(cache, ops, kv, a + answer + [1, 2])
    assert keep == len(a) + len(answer) and cache.stats().restored == 1


def test_a_leaving_slot_leaves_states_at_its_checkpoints_so_a_repeat_and_the_next_turn_restore():
    cache, ops, kv, _ = make(1, host_budget=1 << 22, interval=512)
    prompt = list(range(2000, 3300))  # checkpoints at 512, 1024, the tail and the end
    slot, _ = turn(cache, ops, kv, prompt, answer=[7, 8, 9])
    assert ops.positions(slot.seq) == [512, 1024, len(prompt) - TAIL, len(prompt)]
    # Evicting it leaves the tail and 1024 (the end is 4 tokens from the tail); not the whole slot:
    # its answer is 3 tokens past the tail, which the next turn prefills again.
    turn(cache, ops, kv, [5] * 80)
    entries = sorted(len(e.tokens) for e in cache.host.entries.values())
    assert entries == [1024, len(prompt) - TAIL]
    # The next turn, the answer rendered differently: the tail's state, TAIL tokens more to prefill.
    _, keep = turn(cache, ops, kv, prompt + [70, 80, 1, 2])
    assert keep == len(prompt) - TAIL
    # A restart's or a retry's repeat of the request: all but the tail, from host RAM.
    turn(cache, ops, kv, [6] * 80)
    _, keep = turn(cache, ops, kv, prompt)
    assert keep == len(prompt) - TAIL
    # The slot came from a saved state (no checkpoints below 1296 in it): a prompt that parts at
    # 1100 takes the saved state at 1024, not a cold prefill.
    _, keep = turn(cache, ops, kv, prompt[:1100] + [8, 8])
    assert keep == 1024
    # The next turn, the answer rendered differently: the repeat left its whole prompt (it had no
    # answer, and no checkpoint below its end: it started from the tail's state).
    turn(cache, ops, kv, [4] * 80)
    _, keep = turn(cache, ops, kv, prompt + [70, 80, 1, 2])
    assert keep == len(prompt)
    # A new session, the same system prompt, another question: the interval checkpoint below it.
    turn(cache, ops, kv, [3] * 80)
    _, keep = turn(cache, ops, kv, prompt[:1050] + [9, 9, 9])  # before the 1098 the last one left
    assert keep == 1024
    check(cache, kv)


def test_a_hybrid_slot_checkpoints_where_its_last_user_message_begins_and_leaves_a_state_there():
    cache, ops, kv, _ = make(1, host_budget=1 << 22, interval=512)
    system = list(range(2000, 3100))  # system prompt and tools
    prompt = TurnPrompt(system + list(range(5000, 5200)), lambda toks: len(system))
    slot, _ = turn(cache, ops, kv, prompt, answer=[7, 8, 9])
    assert len(system) in ops.positions(slot.seq)
    turn(cache, ops, kv, [5] * 80)  # evicts it: the tail and the turn (the 3-token answer is not worth a state)
    entries = sorted(len(e.tokens) for e in cache.host.entries.values())
    assert entries == [len(system), len(prompt) - TAIL]
    # The agent's next session: the same system prompt, another question.
    _, keep = turn(cache, ops, kv, system + list(range(6000, 6100)))
    assert keep == len(system)
    check(cache, kv)


def test_a_prompt_that_parts_from_a_cached_one_checkpoints_there_and_leaves_a_state_there():
    # Two raw prompts share a document and part after it, with no break to find (no turn): the
    # second one's prefill stops where it parted, so a third with yet another tail comes back to
    # the document's end from a saved state (host RAM here, disk after a restart: the same states),
    # not only to the interval mark below it.
    cache, ops, kv, _ = make(1, host_budget=1 << 22, interval=512)
    doc = list(range(2000, 3100))
    turn(cache, ops, kv, doc + list(range(5000, 5040)), answer=[7, 8, 9])
    slot, keep = turn(cache, ops, kv, doc + list(range(6000, 6040)), answer=[7, 8, 9])
    assert keep == 1024 and slot.parted == len(doc)  # from the interval checkpoint below the parting
    assert len(doc) in ops.positions(slot.seq)
    turn(cache, ops, kv, [5] * 80)  # evicts it: a state at the tail and one where it parted
    entries = sorted(len(e.tokens) for e in cache.host.entries.values())
    assert len(doc) in entries, entries
    _, keep = turn(cache, ops, kv, doc + list(range(7000, 7040)))
    assert keep == len(doc)
    check(cache, kv)


def test_after_a_restart_the_state_where_it_parted_serves_though_the_warm_slot_shares_more():
    # The slot a restart starts warm (prefix.warm: the longest of the newest entries) holds the
    # last prompt whole, which shares the document with the next one and cannot be cut back; the
    # entry left where the prompts parted covers the document exactly. Before: the slot was picked,
    # its cut failed, and the request prefilled everything.
    from tests.batching.test_prefix_disk import FakeTier

    store: dict = {}
    kv = RecurrentKv(1)
    ops = CheckpointKv(kv, Partial(kv), interval=512)
    cache = PrefixCache(1, ops, disk=FakeTier(store))
    doc, answer = list(range(2000, 2700)), list(range(900, 900 + SHORT_ANSWER + 4))  # long enough to be kept
    turn(cache, ops, kv, doc + list(range(5000, 5040)), answer=answer)
    turn(cache, ops, kv, doc + list(range(6000, 6040)), answer=answer)
    cache.persist()
    assert tuple(doc) in {t for t, _ in store.values()}
    kv2 = RecurrentKv(1)
    ops2 = CheckpointKv(kv2, Partial(kv2), interval=512)
    cache2 = PrefixCache(1, ops2, disk=FakeTier(store))
    assert cache2.warm() == len(doc) + 40 + len(answer)  # the whole last prompt and its answer
    _, keep = turn(cache2, ops2, kv2, doc + list(range(7000, 7040)))
    assert keep == len(doc)
    check(cache2, kv2)


def test_a_leaving_slot_with_a_longer_answer_leaves_its_whole_content_too():
    cache, ops, kv, _ = make(1, host_budget=1 << 22, interval=512)
    prompt = list(range(2000, 3300))
    answer = list(range(100, 100 + SHORT_ANSWER + 1))
    turn(cache, ops, kv, prompt, answer=answer)
    turn(cache, ops, kv, [5] * 80)
    entries = sorted(len(e.tokens) for e in cache.host.entries.values())
    assert entries == [1024, len(prompt) - TAIL, len(prompt) + len(answer)]
    _, keep = turn(cache, ops, kv, prompt + answer + [1, 2])  # the next turn, the answer as it was
    assert keep == len(prompt) + len(answer)
    check(cache, kv)


def test_leaving_points_prefer_the_tail_to_the_end_and_keep_a_gap():
    assert leaving_points([512, 1024, 1296, 1300], 1303, min_tokens=64) == [1296, 1024]
    assert leaving_points([1300], 1300, min_tokens=64) == []  # the end of a slot with no answer is the slot
    assert leaving_points([700, 1000, 1100, 1200], 1303, min_tokens=64) == [1200, 700]
    assert leaving_points([32, 40], 100, min_tokens=64) == []


def test_leaving_points_take_the_chosen_points_before_the_marks():
    # The prompt's tail and where its last user message begins come first, even 100 tokens apart;
    # a 2048-token mark fills a place only when one is left.
    assert leaving_points([2048, 4096], 4400, min_tokens=64, first=[4399, 4300]) == [4399, 4300]
    assert leaving_points([2048, 4096], 4400, min_tokens=64, first=[4399]) == [4399, 4096]
    # too close: the older (a short question after a shared document), which serves the repeat too
    assert leaving_points([2048, 4096], 4400, min_tokens=64, first=[4399, 4385]) == [4385, 4096]
    # three chosen points (the tail, the last part, where the prompt parted from another) all count
    assert leaving_points([2048, 4096], 4400, min_tokens=64, first=[4399, 4300, 3000]) == [4399, 4300, 3000]
    assert leaving_points([2048, 4096], 4400, min_tokens=64, first=[4399, 4100]) == [4399, 4100]


def test_models_that_can_cut_get_no_wrapper():
    kv = RecurrentKv(1)
    assert with_checkpoints(kv, None, None, None, limit=8) is kv


@pytest.mark.parametrize(
    ("start", "n", "total", "want"),
    [
        (0, 64, 300, 64),  # nothing due inside
        (256, 36, 300, 36),  # already ends where one is due
        (256, 44, 300, 36),  # ends ``tail`` before the prompt's end
        (2000, 64, 5000, 48),  # ends at the interval
        (2047, 64, 5000, 64),  # one token would be a chunk shorter than min_chunk 8: not split
    ],
)
def test_clip_ends_chunks_where_a_checkpoint_is_due(start, n, total, want):
    ops = CheckpointKv(RecurrentKv(1), None, interval=2048, tail=8)  # min_chunk 8 (exact_prefix): tail 8
    assert ops.clip(start, n, total, min_chunk=8) == want
