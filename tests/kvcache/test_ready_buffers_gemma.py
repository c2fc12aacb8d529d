"""Eviction saves into memory made ready while the slot idled (state_memory.py), on real llama.cpp:
Gemma 3 270M's state of a 1.5k-token prompt (about 10 MB, past the pool's smallest) fills a buffer
after the request, the newcomer's eviction takes it, and the state it held, written to disk and
restored by the next session, answers as a cold run does (``exact_prefix``)."""

from __future__ import annotations

import time

import pytest

from tests.batching.conftest import load, request, run
from tests.conftest import needs_llama
from tests.kvcache.test_restart_session import _with_sha

pytestmark = [needs_llama, pytest.mark.llama, pytest.mark.gemma]

OPTS = {"n_slots": 1, "slot_ctx": 2048, "exact_prefix": True, "kv_ram_bytes": 0}
PROMPT = "the keeper climbs the stairs of the lighthouse every evening to light the lamp. " * 90


def test_an_eviction_saves_into_a_ready_buffer_and_the_state_restores(gemma_gguf, tmp_path, monkeypatch):
    _with_sha(monkeypatch)
    cold = load(gemma_gguf, prefix_cache=False, **{**OPTS, "kv_ram_bytes": None})
    try:
        ref = run(cold, request(PROMPT, max_tokens=8)).text
    finally:
        cold.close()
    first = load(gemma_gguf, kv_dir=str(tmp_path), **OPTS)
    try:
        pool = first._sched._buffers
        run(first, request(PROMPT, max_tokens=8))
        deadline = time.monotonic() + 30
        while pool.filled < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool.filled >= 1 and pool.ready_bytes >= 4 << 20
        run(first, request("A different story about a garden and its bees, " * 3, max_tokens=4))
        assert pool.taken >= 1, "the eviction's save took the ready buffer"
    finally:
        first.close()
    second = load(gemma_gguf, kv_dir=str(tmp_path), **OPTS)
    try:
        got = run(second, request(PROMPT, max_tokens=8))
        hits = second._sched.cache.stats().disk_hits
    finally:
        second.close()
    assert hits == 1 and got.usage.cached_tokens > 1000
    assert got.text == ref
