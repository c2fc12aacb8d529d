"""The drafting parts without llama.cpp: n-gram lookup, the pay-off policy, the cost model
and the mode setting (the scheduler side is tested on real models in test_exactness.py)."""

from __future__ import annotations

import pytest

from localrun.errors import ConfigError, UnsupportedFeature
from localrun.runtimes.llamacpp.speculative import (
    MAX_DRAFT, DecodeCosts, DraftPolicy, NgramIndex, SpecState, parse_mode, speculation,
)
from localrun.types import Plan


def test_ngram_index_proposes_what_followed_the_longest_match():
    idx = NgramIndex([7, 1, 2, 8, 5, 1, 2, 9, 7, 1, 2])
    assert idx.propose(3) == [8, 5, 1]  # "7 1 2" (3-gram) beats the more recent "1 2" → 9
    idx = NgramIndex([5, 1, 2, 9, 4, 1, 2])
    assert idx.propose(2) == [9, 4]  # only the 2-gram matches
    assert NgramIndex([1, 2, 3, 4]).propose(4) == []  # nothing repeats
    assert NgramIndex([1, 2, 1, 2]).propose(5) == [1, 2]  # a self-overlapping repeat: what is known


def test_ngram_index_grows_as_tokens_arrive_and_prefers_the_latest_occurrence():
    idx = NgramIndex([3, 4, 10, 3, 4, 11])
    for tok in (3, 4):
        idx.append(tok)
    assert idx.propose(1) == [11]
    built = NgramIndex([3, 4, 10, 3, 4, 11, 3, 4])
    assert built.propose(2) == idx.propose(2) == [11, 3]


def _costs(one=0.010, extra=0.002, rows=None):
    costs = DecodeCosts()
    costs.observe_plain(1, one)
    for r, t in (rows or {}).items():
        costs.observe_plain(r, t)
    costs.observe_verify(4, one + 3 * extra)
    return costs


def test_policy_declines_until_shadow_drafts_prove_right_then_backs_off():
    costs, policy = _costs(), DraftPolicy()
    assert policy.choose(5, costs, 1).k == 0  # the prior: drafts are rarely right
    for _ in range(4):  # declined proposals that plain decoding then produced exactly
        policy.shadow([1, 2, 3, 4, 5])
        for tok in (1, 2, 3, 4, 5):
            policy.observe(tok)
    decision = policy.choose(5, costs, 1)
    assert decision.k >= 3, decision
    for _ in range(6):  # verified drafts that were wrong from the first token
        policy.record(decision.k, 0)
    assert policy.choose(5, costs, 1).k == 0


def test_a_wrong_shadow_draft_is_scored_at_its_first_miss():
    policy = DraftPolicy()
    before = list(policy.right)
    policy.shadow([1, 2, 3])
    policy.observe(1)
    policy.observe(9)  # miss at the second token: one right, then wrong
    assert policy.right[0] > before[0] and policy.right[1] < before[1] and policy.right[2] < before[2]
    policy.observe(2)  # no shadow pending any more: nothing changes
    assert policy.right[1] < before[1]


def test_batched_steps_need_better_drafts_than_a_single_stream():
    """Beside 3 others a sequence's share of a step is small, so a pass of its own must bring more."""
    costs = _costs(rows={4: 0.014})
    policy = DraftPolicy()
    policy.right = [0.7, 0.5, 0.35, 0.25, 0.15, 0.1]
    assert policy.choose(6, costs, 1).k > 0
    assert policy.choose(6, costs, 4).k == 0


def test_no_plain_step_measured_means_no_draft_and_fixed_mode_always_drafts():
    assert DraftPolicy().choose(4, DecodeCosts(), 1).k == 0
    assert DraftPolicy(fixed_k=3).choose(5, DecodeCosts(), 1).k == 3
    assert DraftPolicy(fixed_k=3).choose(2, DecodeCosts(), 1).k == 2


def test_cost_model_fits_the_extra_row_cost():
    costs = DecodeCosts()
    assert costs.verify(3) is None
    costs.observe_plain(1, 0.010)
    assert costs.verify(3) == pytest.approx(0.010 * (1 + 2 * DecodeCosts.PRIOR_EXTRA))
    costs.observe_verify(5, 0.018)
    assert costs.verify(5) == pytest.approx(0.018)
    assert costs.share(3) == pytest.approx(0.010)  # nearest measured row count below, per sequence


def test_spec_state_counts_and_feeds_the_index():
    state = SpecState([1, 2, 3, 1, 2], fixed_k=None)
    assert state.index.propose(2) == [3, 1]
    state.verified(2, 1)
    state.pushed(3)
    assert (state.drafted, state.accepted, state.passes) == (2, 1, 1)
    assert state.index.tokens[-1] == 3


def test_modes_and_errors():
    assert parse_mode(None) == "off" and parse_mode("NGRAM") == "ngram" and parse_mode(False) == "off"
    with pytest.raises(ConfigError) as exc:
        parse_mode("fast")
    assert "auto, off, ngram, draft" in exc.value.hint and exc.value.param == "speculative"
    plan = Plan(runtime="llama.cpp", options={"speculative": "ngram", "draft_k": 3})
    assert speculation(plan, 0) == ("ngram", 3)
    with pytest.raises(ConfigError, match="draft_k must be 1-6"):
        speculation(Plan(runtime="llama.cpp", options={"draft_k": MAX_DRAFT + 1}), 0)
    with pytest.raises(UnsupportedFeature, match="draft model"):
        speculation(Plan(runtime="llama.cpp", options={"speculative": "draft"}), 0)
    # a sliding-window cache that is not full-size: no drafting
    assert speculation(Plan(runtime="llama.cpp", options={"swa_full": False}), 512)[0] == "off"
