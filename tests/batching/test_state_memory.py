"""Memory made ready for the states an idle slot would leave with (runtimes/llamacpp/cache/state_memory.py):
the pool fills on its own thread, a save takes a buffer and shrinks it to what llama.cpp wrote,
the budget holds, and the prefix cache asks for as many buffers as its slot would leave states."""

from __future__ import annotations

import ctypes
import mmap
import sys
import time

import pytest

from localrun.runtimes.llamacpp.cache import kv_file
from localrun.runtimes.llamacpp.cache.checkpoints import CheckpointKv
from localrun.runtimes.llamacpp.cache.leaving import SHORT_ANSWER
from localrun.runtimes.llamacpp.cache.prefix import PrefixCache
from localrun.runtimes.llamacpp.cache.slots import read_state
from localrun.runtimes.llamacpp.cache.state_memory import ALIGN, ReadyBuffers, shrink
from localrun.runtimes.llamacpp.turns import TurnPrompt
from tests.batching.test_checkpoints import Partial, RecurrentKv, turn

MB = 1 << 20


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the pool did not fill in time"
        time.sleep(0.01)


def _writer(byte: int, n: int):
    """A stand-in for ``llama_state_seq_get_data``: writes ``n`` bytes of ``byte``, returns ``n``."""

    def get(dst, size):
        ctypes.memset(dst, byte, n)
        return n

    return get


def test_a_want_fills_buffers_a_save_takes_one_and_it_shrinks_to_what_was_written():
    pool = ReadyBuffers(64 * MB, size_of=lambda seq: 9 * MB)
    try:
        pool.want(0, 2)
        _wait(lambda: pool.filled == 2)
        each = -(-(9 * MB + 9 * MB // 8) // ALIGN) * ALIGN
        assert pool.ready_bytes == 2 * each  # headroom over the state, whole huge pages
        blob = read_state(9 * MB, _writer(7, 9 * MB - 123), pool)
        assert pool.taken == 1 and pool.ready_bytes == each
        assert len(blob) == 9 * MB - 123 and bytes(memoryview(blob)[-4:]) == b"\x07" * 4
        if sys.platform.startswith("linux"):
            assert isinstance(blob, mmap.mmap), "shrunk in place (mremap), not copied"
        # Without a ready buffer a save still works, in fresh memory.
        pool.forget(0)
        assert pool.ready_bytes == 0
        again = read_state(9 * MB, _writer(3, 9 * MB), pool)
        assert pool.taken == 1 and len(again) == 9 * MB
    finally:
        pool.close()


def test_a_bigger_state_remakes_the_buffers_a_smaller_keeps_them():
    sizes = {0: 8 * MB}
    pool = ReadyBuffers(64 * MB, size_of=lambda seq: sizes[seq])
    try:
        pool.want(0, 1)
        _wait(lambda: pool.filled == 1)
        small = pool.ready_bytes
        sizes[0] = 7 * MB  # the next turn was shorter: the buffer still fits
        pool.want(0, 1)
        time.sleep(0.05)
        assert pool.filled == 1 and pool.ready_bytes == small
        sizes[0] = 20 * MB  # it grew past the headroom: a new buffer
        pool.want(0, 1)
        _wait(lambda: pool.filled == 2)
        assert pool.ready_bytes > 20 * MB
    finally:
        pool.close()


def test_the_budget_holds_and_small_states_get_nothing():
    pool = ReadyBuffers(16 * MB, size_of=lambda seq: {0: 10 * MB, 1: 10 * MB, 2: MB}[seq])
    try:
        pool.want(0, 2)  # 2 x 12 MB: over the budget, nothing for this slot
        pool.want(2, 1)  # under a chunk: a fresh buffer costs little
        time.sleep(0.05)
        assert pool.filled == 0 and pool.ready_bytes == 0
        pool.want(0, 1)
        pool.want(1, 1)  # fits alone, not beside seq 0's
        _wait(lambda: pool.filled == 1)
        time.sleep(0.05)
        assert pool.filled == 1 and pool.ready_bytes <= 16 * MB
        pool.forget(0)  # seq 0's room goes to seq 1
        _wait(lambda: pool.filled == 2)
        assert pool.ready_bytes <= 16 * MB
    finally:
        pool.close()
    assert pool.ready_bytes == 0 and not pool._thread.is_alive()


def test_shrink_keeps_the_first_bytes():
    buf = kv_file.blob_buffer(kv_file.CHUNK * 2)
    buf[:3] = b"abc"
    assert bytes(memoryview(shrink(buf, 5))[:3]) == b"abc" and len(shrink(buf, 5)) == 5
    small = bytearray(b"abcdef")
    assert shrink(small, 2) is small and small == b"ab"


class Recorder:
    """ReadyBuffers' interface, recording what the prefix cache asks."""

    def __init__(self) -> None:
        self.wants: dict[int, int] = {}
        self.forgot: list[int] = []

    def want(self, seq: int, count: int) -> None:
        self.wants[seq] = count

    def forget(self, seq: int) -> None:
        self.forgot.append(seq)

    def take(self, size: int):
        return None


def _hybrid(host_budget: int = 1 << 22):
    kv = RecurrentKv(1)
    ops = CheckpointKv(kv, Partial(kv), limit=8, interval=512)
    rec = Recorder()
    return PrefixCache(1, ops, host_budget=host_budget, buffers=rec), ops, kv, rec


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        (list(range(2000, 3300)), [7, 8, 9]),  # the tail and an interval checkpoint
        (list(range(2000, 3300)), list(range(100, 100 + SHORT_ANSWER + 1))),  # and the whole slot
        (TurnPrompt(list(range(2000, 3100)) + list(range(5000, 5200)), lambda toks: 1100), [7, 8, 9]),  # the turn
    ],
)
def test_the_cache_wants_as_many_buffers_as_its_slot_then_leaves_states(prompt, answer):
    cache, ops, kv, rec = _hybrid()
    slot, _ = turn(cache, ops, kv, prompt, answer=answer)
    wanted = rec.wants[slot.seq]
    turn(cache, ops, kv, [5] * 40)  # evicts it
    assert wanted == len(cache.host.entries) > 0
    assert rec.forgot == [slot.seq], "the evicted slot's buffers go with it"
    assert rec.wants[slot.seq] == 0, "40 tokens in the slot now: under a state worth keeping"


def test_without_a_tier_to_keep_states_nothing_is_wanted():
    cache, ops, kv, rec = _hybrid(host_budget=0)
    turn(cache, ops, kv, list(range(2000, 3300)), answer=[7, 8, 9])
    assert rec.wants == {0: 0}


def test_a_plain_attention_slot_wants_one_and_none_once_its_prefix_is_held():
    from tests.batching.test_prefix import FakeKv, run

    kv, rec = FakeKv(2), Recorder()
    cache = PrefixCache(2, kv, host_budget=1 << 22, buffers=rec)
    prompt = list(range(100, 400))
    run(cache, kv, prompt, [1, 2, 3])
    assert rec.wants == {0: 1}
    run(cache, kv, [9] * 40)  # the other slot: too short for a state
    assert rec.wants[1] == 0
    run(cache, kv, [8] * 100)  # evicts slot 0, the least recently used: its state goes to host RAM
    assert len(cache.host.entries) == 1 and rec.wants[0] == 1 and rec.forgot == [0]
    run(cache, kv, prompt[:200])  # restored from host RAM into slot 1, no answer: nothing new to keep
    assert [len(s.tokens) for s in cache.slots] == [100, 200] and cache.stats().restored == 1
    assert rec.wants[1] == 0, "host RAM holds a longer state that serves these 200 tokens"
