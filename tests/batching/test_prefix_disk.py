"""The disk tier's policy under the prefix cache (prefix_disk.py), against stand-ins.

The KV stand-in is test_prefix's (each sequence's "KV" a token list, its blob that list as
JSON); the tier stand-in keeps entries in a dict shaped like ``kv_disk.DiskTier``'s API and,
like the real one, survives a "restart" (a new PrefixCache on the same tier store).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from localrun.runtimes.llamacpp.cache.host_tier import HOST_MIN_TOKENS
from localrun.runtimes.llamacpp.cache.prefix import PrefixCache
from localrun.runtimes.llamacpp.cache.prefix_disk import PRIOR_PREFILL_TOK_S, model_sha256
from tests.batching.test_prefix import FakeKv, check, run


@dataclass(frozen=True)
class Entry:
    path: Path
    tokens: tuple[int, ...]
    nbytes: int
    used_at: float
    kind: str = "prefix"
    model_name: str = ""


class FakeTier:
    """A DiskTier stand-in: ``store`` is "the disk" (shared across restarts); writes land at once
    unless ``queued`` (then at ``flush``)."""

    def __init__(self, store: dict | None = None, *, read_bytes_per_s: float = 1e9, budget: int = 10**9) -> None:
        self.store = {} if store is None else store
        self.read_bytes_per_s = read_bytes_per_s
        self.budget = budget
        self.queued: list[tuple] | None = None
        self.loads = self.flushes = self.closed = 0
        self.times: dict[str, float] = {}  # an entry's last use (mtime), 0 unless set
        self._n = itertools.count(len(self.store))

    def entries(self):
        return [
            Entry(Path(name), tokens, len(blob), self.times.get(name, 0.0))
            for name, (tokens, blob) in self.store.items()
        ]

    def put(self, tokens, blob, *, kind="prefix"):
        if len(blob) > self.budget:
            return False
        if self.queued is not None:
            self.queued.append((tuple(tokens), blob))
        else:
            self.store[f"e{next(self._n)}"] = (tuple(tokens), blob)
        return True

    def load(self, entry):
        self.loads += 1
        got = self.store.get(str(entry.path))
        return None if got is None else got[1]

    def discard(self, entry):
        self.store.pop(str(entry.path), None)

    def flush(self, timeout_s=30.0):
        self.flushes += 1
        for tokens, blob in self.queued or ():
            self.store[f"e{next(self._n)}"] = (tokens, blob)
        if self.queued is not None:
            self.queued = []

    def close(self):
        self.closed += 1

    def counters(self):
        return {
            "entries": len(self.store),
            "bytes": sum(len(b) for _, b in self.store.values()),
            "tokens": sum(len(t) for t, _ in self.store.values()),
            "read_bytes": 0,
            "written_bytes": 0,
        }

    def tokens_on_disk(self) -> set[tuple[int, ...]]:
        return {t for t, _ in self.store.values()}


def prompt(base: int, n: int = 200) -> list[int]:
    return list(range(base, base + n))


def test_ram_evictions_spill_to_disk_least_recently_used_first():
    kv, tier = FakeKv(1), FakeTier()
    blob_size = len(json.dumps(prompt(1000)).encode())  # one 200-token "blob" fits in RAM, two do not
    cache = PrefixCache(1, kv, host_budget=blob_size + 10, disk=tier)
    run(cache, kv, prompt(1000))
    run(cache, kv, prompt(2000))  # slot content of 1000 goes to RAM
    assert cache.stats().host_entries == 1 and not tier.store
    run(cache, kv, prompt(3000))  # 2000 goes to RAM, which drops 1000 to disk
    assert tier.tokens_on_disk() == {tuple(prompt(1000))}
    assert cache.stats().host_entries == 1
    check(cache, kv)


def test_with_ram_off_an_evicted_slot_goes_straight_to_disk():
    kv, tier = FakeKv(1), FakeTier()
    cache = PrefixCache(1, kv, host_budget=0, disk=tier)
    run(cache, kv, prompt(1000))
    run(cache, kv, prompt(2000))
    assert tier.tokens_on_disk() == {tuple(prompt(1000))}
    slot, keep = run(cache, kv, prompt(1000) + [7, 8, 9])  # and comes back from there
    assert keep == 200 and cache.stats().disk_hits == 1 and cache.stats().disk_restored_tokens == 200
    check(cache, kv)


def test_a_restart_finds_what_the_last_session_persisted_and_restores_it():
    store: dict = {}
    kv, tier = FakeKv(2), FakeTier(store)
    tier.queued = []  # the writer thread: nothing is on disk before the flush
    cache = PrefixCache(2, kv, host_budget=10**6, disk=tier)
    run(cache, kv, prompt(1000), [1, 2, 3])
    run(cache, kv, prompt(5000, 120))
    cache.persist()
    assert tier.flushes == 1 and tier.closed == 1
    assert tier.tokens_on_disk() == {(*prompt(1000), 1, 2, 3), tuple(prompt(5000, 120))}
    cache.persist()  # a second close writes nothing again
    assert len(store) == 2

    kv2 = FakeKv(2)
    cache2 = PrefixCache(2, kv2, disk=FakeTier(store))  # the new process, same cache dir
    slot, keep = run(cache2, kv2, prompt(1000) + [1, 2, 3, 4, 5])
    assert keep == 203 and kv2.calls[0] == ("restore", slot.seq)
    stats = cache2.stats()
    assert (stats.disk_hits, stats.disk_restored_tokens, stats.disk_entries) == (1, 203, 2)
    check(cache2, kv2)
    # A cut-back restore: a prompt sharing only the first 150 tokens.
    slot, keep = run(cache2, kv2, prompt(5000, 100) + [9] * 50)
    assert keep == 100
    check(cache2, kv2)


def test_persist_skips_what_disk_already_holds_and_short_slots():
    store: dict = {}
    kv = FakeKv(2)
    cache = PrefixCache(2, kv, disk=FakeTier(store))
    run(cache, kv, prompt(1000))
    run(cache, kv, list(range(HOST_MIN_TOKENS - 1)))  # too short to be worth a file
    cache.persist()
    assert len(store) == 1
    kv2 = FakeKv(2)
    cache2 = PrefixCache(2, kv2, disk=FakeTier(store))
    run(cache2, kv2, prompt(1000)[:150])  # restored and cut: the slot holds a prefix of the file
    cache2.persist()
    assert len(store) == 1


class BadBlobKv(FakeKv):
    def restore(self, seq, blob):
        self.calls.append(("restore", seq))
        return False  # llama_state_seq_set_data returned 0


def test_a_blob_llama_cpp_refuses_is_deleted_and_the_request_prefills():
    store: dict = {}
    kv = FakeKv(1)
    cache = PrefixCache(1, kv, disk=FakeTier(store))
    run(cache, kv, prompt(1000))
    cache.persist()
    kv2 = BadBlobKv(1)
    cache2 = PrefixCache(1, kv2, disk=FakeTier(store))
    slot, keep = run(cache2, kv2, prompt(1000) + [1])
    assert keep == 0 and slot.tokens == prompt(1000) + [1]
    assert not store  # deleted: it would never restore
    assert cache2.stats().disk_hits == 0 and cache2.stats().disk_misses == 1
    check(cache2, kv2)


def test_a_file_that_fails_its_check_is_forgotten_and_the_request_prefills():
    store: dict = {}
    kv = FakeKv(1)
    cache = PrefixCache(1, kv, disk=FakeTier(store))
    run(cache, kv, prompt(1000))
    cache.persist()
    tier = FakeTier(store)
    cache2 = PrefixCache(1, FakeKv(1), disk=tier)
    store.clear()  # the tier's load finds it bad (or gone) and returns None
    slot, keep = run(cache2, cache2._ops, prompt(1000) + [1])
    assert keep == 0 and tier.loads == 1
    slot, keep = run(cache2, cache2._ops, prompt(1000) + [2])  # the slot's own copy now, not the disk
    assert keep == 200 and tier.loads == 1


def test_restore_is_skipped_when_prefilling_is_cheaper():
    store: dict = {}
    kv = FakeKv(1)
    cache = PrefixCache(1, kv, disk=FakeTier(store))
    run(cache, kv, prompt(1000))
    cache.persist()
    (tokens, blob) = next(iter(store.values()))
    # Reading the blob takes longer than prefilling its 200 tokens at the measured speed.
    slow = FakeTier(store, read_bytes_per_s=len(blob) / 1.0)  # one second to read
    cache2 = PrefixCache(1, FakeKv(1), disk=slow)
    cache2.observe_prefill(1000, 1.0)  # 1,000 tok/s: 200 tokens take 0.2 s
    slot, keep = run(cache2, cache2._ops, prompt(1000) + [1])
    assert keep == 0 and slow.loads == 0
    assert cache2.stats().disk_misses == 1
    # Measured faster reading (or slower prefill): now it restores.
    cache3 = PrefixCache(1, FakeKv(1), disk=FakeTier(store, read_bytes_per_s=len(blob) / 0.01))
    cache3.observe_prefill(1000, 1.0)
    slot, keep = run(cache3, cache3._ops, prompt(1000) + [1])
    assert keep == 200


def test_before_any_prefill_is_timed_the_prior_decides():
    store: dict = {}
    kv = FakeKv(1)
    cache = PrefixCache(1, kv, disk=FakeTier(store))
    run(cache, kv, prompt(1000))
    cache.persist()
    blob = next(iter(store.values()))[1]
    # Read time just over the prior's prefill time of 200 tokens: skipped; just under: restored.
    over = FakeTier(store, read_bytes_per_s=len(blob) / (200 / PRIOR_PREFILL_TOK_S) * 0.9)
    c = PrefixCache(1, FakeKv(1), disk=over)
    assert run(c, c._ops, prompt(1000) + [1])[1] == 0
    under = FakeTier(store, read_bytes_per_s=len(blob) / (200 / PRIOR_PREFILL_TOK_S) * 1.1)
    c = PrefixCache(1, FakeKv(1), disk=under)
    assert run(c, c._ops, prompt(1000) + [1])[1] == 200


def test_a_slot_and_host_ram_are_preferred_over_disk():
    store: dict = {}
    kv = FakeKv(2)
    cache = PrefixCache(2, kv, host_budget=10**6, disk=FakeTier(store))
    run(cache, kv, prompt(1000))
    cache.persist()
    tier = FakeTier(store)
    kv2 = FakeKv(2)
    cache2 = PrefixCache(2, kv2, host_budget=10**6, disk=tier)
    run(cache2, kv2, prompt(1000) + [1])  # from disk
    assert tier.loads == 1
    run(cache2, kv2, prompt(1000) + [2])  # from the slot now
    assert tier.loads == 1 and cache2.stats().disk_hits == 1


def test_a_cold_long_prompt_counts_a_disk_miss_and_stats_fill_the_disk_fields():
    kv, tier = FakeKv(1), FakeTier()
    cache = PrefixCache(1, kv, disk=tier)
    run(cache, kv, prompt(1000))
    run(cache, kv, list(range(10)))  # short: no lookup worth counting
    stats = cache.stats()
    assert stats.disk_misses == 1 and stats.disk_entries == 1  # the first went down when the second came
    assert stats.disk_tokens == 200 and stats.disk_bytes > 0


def test_the_key_is_the_sha256s_or_else_each_files_fingerprint(tmp_path):
    @dataclass
    class F:
        path: str
        sha256: str | None

    @dataclass
    class R:
        files: tuple
        path: str = ""

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    assert model_sha256(R((F("x", "ab"),))) == "ab"
    assert model_sha256(R((F("x", "ab"), F("y", "cd")))) == model_sha256(R((F("y", "cd"), F("x", "ab"))))
    printed = model_sha256(R((F(str(model), None),)))
    assert printed.startswith("fp-") and printed == model_sha256(R((), path=str(model)))
    model.write_bytes(b"GGUF" + bytes(99) + b"!")  # other bytes: another key
    assert model_sha256(R((F(str(model), None),))) not in ("", printed)
    assert model_sha256(R((F(str(tmp_path / "gone.gguf"), None),))) == ""  # unreadable: no key


def test_the_measured_speeds_survive_a_restart_beside_the_entries(tmp_path):
    store: dict = {}
    tier = FakeTier(store)
    tier.folder = tmp_path
    kv = FakeKv(1)
    cache = PrefixCache(1, kv, disk=tier)
    run(cache, kv, prompt(1000))
    cache.observe_prefill(500, 1.0)  # this machine prefills 500 tok/s
    tier.read_bytes_per_s = 3e9  # and the tier measured its reads
    cache.persist()
    again = FakeTier(store)
    again.folder = tmp_path
    cache2 = PrefixCache(1, FakeKv(1), disk=again)
    assert cache2.disk.prefill_tok_s == 500 and again.read_bytes_per_s == 3e9
    (tmp_path / "speeds.json").write_text("{not json")  # a damaged file costs only the priors
    third = FakeTier(store)
    third.folder = tmp_path
    assert PrefixCache(1, FakeKv(1), disk=third).disk.prefill_tok_s == PRIOR_PREFILL_TOK_S
    for damaged in ("[500, 3e9]", '{"prefill_tok_s": "fast"}', "9" * 20_000_000):  # not an object, a word, huge
        (tmp_path / "speeds.json").write_text(damaged)
        other = FakeTier(store)
        other.folder = tmp_path
        assert PrefixCache(1, FakeKv(1), disk=other).disk.prefill_tok_s == PRIOR_PREFILL_TOK_S


class UncuttableKv(FakeKv):
    """A memory whose saved states restore only whole (a recurrent or hybrid model's)."""

    cuttable = False

    def truncate(self, seq, keep):  # cutting nothing works (llama.cpp's seq_rm past the end), else not
        self.calls.append(("truncate", seq, keep))
        return keep >= len(self.kv[seq])


def test_a_memory_that_cannot_be_cut_reads_a_disk_entry_only_when_the_prompt_covers_it_whole():
    store: dict = {}
    kv, tier = UncuttableKv(1), FakeTier(store)
    tier.store["e0"] = (tuple(prompt(1000)), json.dumps(prompt(1000)).encode())
    cache = PrefixCache(1, kv, disk=tier)
    run(cache, kv, prompt(1000, 150) + [9] * 60)  # shares 150 of the entry's 200: no read
    assert tier.loads == 0 and cache.stats().disk_hits == 0
    cache2 = PrefixCache(1, UncuttableKv(1), disk=FakeTier(store))
    slot, keep = run(cache2, cache2._ops, prompt(1000) + [5, 6, 7])  # covers it whole: restored
    assert keep == 200 and cache2.stats().disk_hits == 1


class WindowKv(FakeKv):
    """A sliding-window model with a full-size cache: the live sequence cuts anywhere, but a saved
    state keeps only the last WINDOW tokens' window cells, so a restored one cuts nowhere (as
    llama.cpp's iSWA state does: measured, 1500 tokens restore with pos_min 988)."""

    WINDOW = 50
    saved_cuttable = False

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.restored: set[int] = set()

    def window_ok(self, seq, keep):
        return seq not in self.restored or keep == len(self.kv[seq])

    def truncate(self, seq, keep):
        if not self.window_ok(seq, keep):
            return False
        return super().truncate(seq, keep)

    def restore(self, seq, blob):
        self.restored.add(seq)
        return super().restore(seq, blob)

    def clear(self, seq):
        self.restored.discard(seq)
        super().clear(seq)


def _prefill(cache, kv, prompt, answer=()):
    """run(), with the prefill announced as the scheduler does (prompt_end)."""
    slot, keep = cache.acquire(prompt)
    assert slot.tokens == kv.kv[slot.seq] == prompt[:keep]
    slot.tokens.extend(prompt[keep:])
    kv.kv[slot.seq] = list(slot.tokens)
    cache.extended(slot)
    slot.tokens.extend(answer)
    kv.kv[slot.seq] = list(slot.tokens)
    cache.release(slot)
    return slot, keep


def test_a_sliding_window_slot_leaves_states_a_restart_can_restore_whole():
    from localrun.runtimes.llamacpp.cache.checkpoints import DEFAULT_INTERVAL

    store: dict = {}
    kv = WindowKv(1)
    cache = PrefixCache(1, kv, disk=FakeTier(store))
    system = prompt(1000, DEFAULT_INTERVAL + 500)
    first = system + [1, 2, 3]
    _prefill(cache, kv, first, answer=[7, 8, 9])
    cache.persist()  # the unload: its prompt's tail and the interval below (a 3-token answer: no whole)
    # The tail point is the cache's min_tail (1) below the prompt's end: a repeat prefills one token.
    assert sorted(len(t) for t, _ in store.values()) == [DEFAULT_INTERVAL, len(first) - 1]
    kv2 = WindowKv(1)
    cache2 = PrefixCache(1, kv2, disk=FakeTier(store))
    _, keep = _prefill(cache2, kv2, first)  # the same request after the restart
    assert keep == len(first) - 1
    # The slot came from a state (its window only): a prompt parting earlier takes the disk's 2048.
    _, keep = _prefill(cache2, kv2, system[:-100] + [4, 4, 4])
    assert keep == DEFAULT_INTERVAL
    kv3 = WindowKv(1)
    cache3 = PrefixCache(1, kv3, disk=FakeTier(store))
    _, keep = _prefill(cache3, kv3, system[:-100] + [5, 5, 5])  # a new session: the system prompt, another turn
    assert keep == DEFAULT_INTERVAL


def test_a_sliding_window_slot_leaves_a_state_where_its_last_user_message_begins():
    from localrun.runtimes.llamacpp.cache.checkpoints import DEFAULT_INTERVAL

    store: dict = {}
    kv = WindowKv(1)
    cache = PrefixCache(1, kv, disk=FakeTier(store))
    system = prompt(1000, DEFAULT_INTERVAL + 700)  # system prompt and tools, past the 2048 mark
    question = prompt(2000, 300)
    first = system + question
    slot, _ = cache.acquire(first)
    slot.tokens.extend(first)
    kv.kv[slot.seq] = list(slot.tokens)
    cache.extended(slot, lambda: len(system))  # what turns.TurnPrompt.turn says of this prompt
    slot.tokens.extend([7, 8, 9])
    kv.kv[slot.seq] = list(slot.tokens)
    cache.release(slot)
    cache.persist()
    assert sorted(len(t) for t, _ in store.values()) == [len(system), len(first) - 1]
    # The next session after a restart: the same system prompt, another question.
    kv2 = WindowKv(1)
    cache2 = PrefixCache(1, kv2, disk=FakeTier(store))
    _, keep = _prefill(cache2, kv2, system + prompt(3000, 200))
    assert keep == len(system)


def _warm_store() -> tuple[dict, FakeTier]:
    """A disk with an old long entry and a newer slot's leaving: a short state and a long one
    (FakeKv's blobs: the tokens as JSON)."""
    entries = {"old": prompt(9000, 400), "short": prompt(1000, 150), "long": prompt(1000, 300)}
    store = {name: (tuple(tokens), json.dumps(tokens).encode()) for name, tokens in entries.items()}
    tier = FakeTier(store)
    tier.times = {"old": 10.0, "short": 100.0, "long": 99.0}
    return store, tier


def test_a_session_starts_warm_with_the_longest_of_the_newest_entries():
    _, tier = _warm_store()
    kv = FakeKv(2)
    cache = PrefixCache(2, kv, host_budget=10**6, disk=tier)
    assert cache.warm() == 300
    assert cache.slots[0].tokens == prompt(1000, 300) == kv.kv[0] and tier.loads == 1
    assert cache.stats().disk_hits == 0, "counted when a request reuses it, not at load"
    slot, keep = run(cache, kv, prompt(1000, 300) + [5, 6])  # the restart's repeat: the slot, in place
    assert (slot.seq, keep) == (0, 300) and tier.loads == 1
    stats = cache.stats()
    assert (stats.disk_hits, stats.disk_restored_tokens, stats.reused_in_place) == (1, 300, 1)
    run(cache, kv, prompt(1000, 300) + [7])  # the second use is the slot's own, not the disk's
    assert cache.stats().disk_hits == 1
    check(cache, kv)


def test_a_warm_slot_nobody_asks_for_is_evicted_without_a_copy_to_host_ram():
    _, tier = _warm_store()
    kv = FakeKv(1)
    cache = PrefixCache(1, kv, host_budget=10**6, disk=tier)
    cache.warm()
    run(cache, kv, prompt(4000, 100))  # another prompt takes the only slot
    assert ("save", 0) not in kv.calls and cache.stats().host_entries == 0, "the disk holds it already"
    assert cache.stats().disk_hits == 0
    slot, keep = run(cache, kv, prompt(1000, 300) + [1])  # and it still comes back from there
    assert keep == 300 and cache.stats().disk_hits == 1
    check(cache, kv)


def test_nothing_warms_without_a_disk_entry_with_reuse_off_or_where_prefilling_is_cheaper():
    assert PrefixCache(1, FakeKv(1), disk=FakeTier()).warm() == 0
    _, tier = _warm_store()
    assert PrefixCache(1, FakeKv(1), disk=tier, reuse=False).warm() == 0
    assert PrefixCache(1, FakeKv(1)).warm() == 0
    store, _ = _warm_store()
    slow = FakeTier(store, read_bytes_per_s=1.0)  # reading would cost more than prefilling
    assert PrefixCache(1, FakeKv(1), disk=slow).warm() == 0 and slow.loads == 0
