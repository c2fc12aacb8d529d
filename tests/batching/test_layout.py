"""How a plan becomes a slot layout: defaults that keep the KV cache the size the planner
counted, the batch-invariant default, and refusals of nonsense."""

from __future__ import annotations

import pytest

from localrun.errors import ConfigError
from localrun.runtimes.llamacpp.cache.slots import MIN_CHUNK, Layout
from localrun.types import Plan


def layout(n_ctx=8192, n_batch=512, device="cpu", n_gpu_layers=0, **options) -> Layout:
    return Layout.from_plan(
        Plan(
            runtime="llama.cpp", n_ctx=n_ctx, n_batch=n_batch, device=device, n_gpu_layers=n_gpu_layers, options=options
        )
    )


@pytest.mark.parametrize("n_ctx, slots", [(256, 1), (2048, 1), (4095, 1), (4096, 2), (8192, 4), (32768, 4)])
def test_default_slots_share_the_plans_context(n_ctx, slots):
    got = layout(n_ctx)
    assert got.n_slots == slots
    assert got.slot_ctx == n_ctx // slots
    assert got.n_ctx <= n_ctx  # never more KV than the plan counted
    assert not got.unified


def test_options_win_over_the_defaults():
    got = layout(n_ctx=4096, n_slots=8, slot_ctx=1024, step_tokens=128, host_cache_mib=64)
    assert (got.n_slots, got.slot_ctx, got.n_ctx, got.step_tokens) == (8, 1024, 8192, 128)
    assert got.host_cache_bytes == 64 * 2**20
    unified = layout(n_ctx=4096, n_slots=4, kv_unified=True)
    assert unified.unified and unified.slot_ctx == unified.n_ctx == 4096  # one pool, each request may use it all


def test_the_step_follows_n_batch_and_stays_above_two_minimum_chunks():
    assert layout(n_batch=64).step_tokens == 64
    assert layout(n_batch=4).step_tokens == 4
    assert layout(n_batch=4, exact_prefix=True).step_tokens == 2 * MIN_CHUNK
    assert layout(n_batch=4096).step_tokens == 256


def test_batch_invariance_is_the_cpu_default_up_to_seven_slots():
    small = layout(n_slots=7)
    assert small.exact and small.decode_rows == 7
    assert not small.exact_prefix and small.min_chunk == 1
    big = layout(n_slots=8)
    assert not big.exact and big.min_chunk == 1 and big.decode_rows == 8
    assert layout(n_slots=8, batch_invariant=True).exact
    assert not layout(n_slots=2, batch_invariant=False).exact
    assert not layout(device="cuda", n_gpu_layers=99).exact


def test_exact_prefix_adds_the_chunk_rules_and_implies_batch_invariance():
    got = layout(n_slots=8, exact_prefix=True)
    assert got.exact and got.exact_prefix and got.min_chunk == MIN_CHUNK and got.decode_rows == 7


@pytest.mark.parametrize(
    "options",
    [
        {"n_slots": 0},
        {"n_slots": 1000},
        {"slot_ctx": 4},
        {"n_slots": "many"},
        {"host_cache_mib": -1},
        {"step_tokens": -5},
    ],
)
def test_nonsense_options_are_a_config_error(options):
    with pytest.raises(ConfigError):
        layout(**options)
