"""The drafting parts without llama.cpp: n-gram lookup, the pay-off policy, the cost model
and the mode setting (the scheduler side is tested on real models in test_exactness.py)."""

from __future__ import annotations

import pytest

from localrun.errors import ConfigError
from localrun.runtimes.llamacpp.speculative.drafting import (
    FIRST_K,
    MAX_DRAFT,
    PASS_ROWS,
    DecodeCosts,
    DraftPolicy,
    NgramIndex,
    SpecState,
    parse_mode,
    speculation,
)
from localrun.types import Plan


def test_ngram_index_proposes_what_followed_the_longest_match():
    idx = NgramIndex([7, 1, 2, 8, 5, 1, 2, 9, 7, 1, 2])
    assert idx.propose(3) == [8, 5, 1]  # "7 1 2" (3-gram) beats the more recent "1 2" → 9
    idx = NgramIndex([5, 1, 2, 9, 4, 1, 2])
    assert idx.propose(2) == [9, 4]  # only the 2-gram matches
    assert NgramIndex([1, 2, 3, 4]).propose(4) == []  # nothing repeats
    assert NgramIndex([1, 2, 1, 2]).propose(5) == [1, 2, 1, 2, 1]  # a loop: its next turns repeat it


def test_ngram_index_grows_as_tokens_arrive_and_prefers_the_latest_occurrence():
    idx = NgramIndex([3, 4, 10, 3, 4, 11])
    for tok in (3, 4):
        idx.append(tok)
    assert idx.propose(1) == [11]
    built = NgramIndex([3, 4, 10, 3, 4, 11, 3, 4])
    assert built.propose(2) == idx.propose(2) == [11, 3]


def test_among_places_of_a_4gram_the_one_matching_furthest_back_wins():
    # "1 2 3 4" occurs after "8 9" and after "5 6"; the sequence ends "5 6 1 2 3 4".
    toks = [8, 9, 1, 2, 3, 4, 70, 5, 6, 1, 2, 3, 4, 71, 8, 9, 0, 5, 6, 1, 2, 3, 4]
    assert NgramIndex(toks).propose(2) == [71, 8]
    toks[-5] = 9  # now it ends "9 1 2 3 4": the place after "8 9" matches further back
    assert NgramIndex(toks).propose(2) == [70, 5]


def test_the_index_follows_its_source_while_it_agrees_and_looks_again_after_a_miss():
    # A file whose lines look alike: "a = 1" then "a = 2"; after "a =" the latest place would be wrong.
    line1, line2 = [50, 51, 52, 1, 99], [50, 51, 52, 2, 99]
    prompt = [7, *line1, *line2, 8, 50, 51, 52]  # the copy has begun: "a =" ... of line 1?
    idx = NgramIndex(prompt)
    assert idx.propose(2) == [2, 99]  # the latest "50 51 52" place (line 2)
    idx = NgramIndex([7, *line1, *line2, 8, 7, 50, 51])  # the copy began at the start: "7 50 51"
    assert idx.propose(3) == [52, 1, 99]
    for tok in (52, 1, 99):  # agreed: the source moves along
        idx.append(tok)
    assert idx.source is not None and idx.propose(3) == [50, 51, 52]
    idx.append(42)  # a miss: the source is dropped, and found again from the new suffix
    assert idx.source is None and idx.propose(3) == []


def _costs(one=0.010, extra=0.002, rows=None):
    costs = DecodeCosts()
    costs.observe_plain(1, one)
    for r, t in (rows or {}).items():
        costs.observe_plain(r, t)
    for r in PASS_ROWS:
        costs.observe_verify(r, one + (r - 1) * extra)
    return costs


def test_policy_declines_until_shadow_drafts_prove_right_then_backs_off():
    costs, policy = _costs(), DraftPolicy()
    assert policy.choose(7, costs, 1).k == 0  # the prior: drafts are rarely right
    for _ in range(3):  # declined proposals that plain decoding then produced exactly
        policy.shadow([1, 2, 3, 4, 5])
        for tok in (1, 2, 3, 4, 5):
            policy.observe(tok)
    decision = policy.choose(7, costs, 1)
    assert decision.k == FIRST_K, decision  # the first verified draft is short
    policy.record(decision.k, decision.k)
    assert policy.choose(40, costs, 1).k == 7  # whole drafts accepted: the pass size doubles
    policy.record(7, 7)
    assert policy.cap == 15
    policy.p = 0.97  # and long drafts pay only once nearly every token is right
    assert policy.choose(40, costs, 1).k == 15
    for _ in range(10):  # verified drafts that were wrong from the first token
        policy.record(policy.choose(40, costs, 1).k, 0)
    assert policy.choose(40, costs, 1).k == 0


def test_pass_sizes_come_from_the_measured_ladder():
    costs, policy = _costs(), DraftPolicy()
    policy.p, policy.cap = 1.0, MAX_DRAFT
    assert policy.choose(MAX_DRAFT + 5, costs, 1).k == MAX_DRAFT
    assert policy.choose(10, costs, 1).k == 7  # 11 rows is no rung: the next one down
    costs.passes[8] = 0.5  # a size measured as very slow is skipped
    assert policy.choose(10, costs, 1).k == 3


def test_a_wrong_shadow_draft_is_scored_token_by_token_up_to_its_first_miss():
    policy = DraftPolicy()
    before = policy.p
    policy.shadow([1, 2, 3])
    policy.observe(1)
    assert policy.p > before
    raised = policy.p
    policy.observe(9)  # miss at the second token
    assert policy.p < raised
    after_miss = policy.p
    policy.observe(3)  # no shadow pending any more: nothing changes
    assert policy.p == after_miss


def test_batched_steps_need_better_drafts_than_a_single_stream():
    """Beside 3 others a sequence's share of a step is small, so a pass of its own must bring more."""
    costs = _costs(rows={4: 0.014})
    policy = DraftPolicy()
    policy.p = 0.6
    assert policy.choose(6, costs, 1).k > 0
    assert policy.choose(6, costs, 4).k == 0


def test_no_plain_step_measured_means_no_draft_and_fixed_mode_always_drafts():
    assert DraftPolicy().choose(4, DecodeCosts(), 1).k == 0
    assert DraftPolicy(fixed_k=3).choose(5, DecodeCosts(), 1).k == 3
    assert DraftPolicy(fixed_k=3).choose(2, DecodeCosts(), 1).k == 2


def test_cost_model_reads_measured_sizes_and_draws_lines_between_them():
    costs = DecodeCosts()
    assert costs.verify(3) is None
    costs.observe_plain(1, 0.010)
    assert costs.verify(3) == pytest.approx(0.010 * (1 + 2 * DecodeCosts.PRIOR_EXTRA))
    costs.observe_verify(5, 0.018)
    assert costs.verify(5) == pytest.approx(0.018)
    assert costs.verify(3) == pytest.approx(0.014)  # between 1 row and 5
    assert costs.verify(9) == pytest.approx(0.026)  # beyond: the last segment's slope
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
    with pytest.raises(ConfigError, match=f"draft_k must be 1-{MAX_DRAFT}"):
        speculation(Plan(runtime="llama.cpp", options={"draft_k": MAX_DRAFT + 1}), 0)
    with pytest.raises(ConfigError, match="needs a draft model"):
        speculation(Plan(runtime="llama.cpp", options={"speculative": "draft"}), 0)
    assert speculation(Plan(runtime="llama.cpp", options={"speculative": "draft", "draft": "/d.gguf"}), 0) == (
        "draft",
        5,
    )
    # a sliding-window cache that is not full-size: no drafting
    assert speculation(Plan(runtime="llama.cpp", options={"swa_full": False}), 512)[0] == "off"


def test_a_copy_in_progress_is_expected_to_go_on():
    """After a long agreement the run-length estimate beats the per-token rate, so long passes pay."""
    policy = DraftPolicy()
    policy.p = 0.5
    assert policy.expected(7) == pytest.approx(sum(0.5**i for i in range(8)))
    assert policy.expected(7, run=60) == pytest.approx(1 + sum(60 / (60 + i) for i in range(1, 8)))
    costs = _costs()
    policy.cap = MAX_DRAFT
    assert policy.choose(MAX_DRAFT, costs, 1).k < policy.choose(MAX_DRAFT, costs, 1, run=200).k
    idx = NgramIndex([5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8])
    assert idx.propose(3) == [9, 1, 2] and idx.run == 0  # "5 6 7 8" found; nothing before it to agree
    for tok in (9, 1):
        idx.append(tok)
    assert idx.run == 2  # two more tokens as the source said
