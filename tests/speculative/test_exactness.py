"""Speculative decoding on real llama.cpp contexts gives the tokens plain decoding gives.

``ngram`` mode drafts at every n-gram match (the adaptive policy would decline many of
them), so verification, rejection and the KV rollback run as often as possible. The tiny
random-weight model's near-uniform logits flip a greedy token at the slightest arithmetic
difference; Gemma 3 270M is the real model the defaults are measured on.
"""

from __future__ import annotations

import pytest

from localrun.types import Cancel
from tests.batching.conftest import assert_idle, load, request, run, together
from tests.conftest import needs_llama
from tests.speculative.conftest import GEMMA_COPY, GEMMA_FREE, TINY_PROMPTS, assert_same_but_near_ties, pair

pytestmark = [needs_llama, pytest.mark.llama]


@pytest.fixture(params=["tiny", pytest.param("gemma", marks=pytest.mark.gemma)])
def model(request):
    if request.param == "tiny":
        return request.getfixturevalue("tiny_gguf"), TINY_PROMPTS, 40
    return (
        request.getfixturevalue("gemma_gguf"),
        GEMMA_COPY[:2] + GEMMA_FREE[:1],
        24,
    )  # 3 prompts: the suite's time budget


def test_greedy_answers_are_the_same_with_drafts_alone_and_batched(model):
    path, prompts, max_tokens = model
    plain, spec = pair(path)
    try:
        ref = [run(plain, request(p, max_tokens=max_tokens)) for p in prompts]
        alone = [run(spec, request(p, max_tokens=max_tokens)) for p in prompts]
        assert [r.text for r in alone] == [r.text for r in ref]
        assert [r.finish for r in alone] == [r.finish for r in ref]
        assert [r.usage.completion_tokens for r in alone] == [r.usage.completion_tokens for r in ref]
        totals = spec._sched.spec_totals
        assert totals.accepted > 0 and totals.drafted > totals.accepted  # drafts were kept, and some rejected
        assert sum(r.usage.drafted_tokens for r in alone) == totals.drafted
        batched = together(spec, [request(p, max_tokens=max_tokens) for p in prompts])  # 6 requests, 4 slots
        assert [r.text for r in batched] == [r.text for r in ref]
        assert all(r.usage.accepted_tokens <= r.usage.drafted_tokens for r in batched)
        assert_idle(spec)
        # a prompt again, its prefix now from the cache: the same answer
        again = run(spec, request(prompts[-1], max_tokens=max_tokens))
        assert again.usage.cached_tokens > 0 or len(spec.tokenize(prompts[-1], add_special=True)) < 24
        assert again.text == ref[-1].text
    finally:
        plain.close()
        spec.close()


@pytest.mark.gemma
def test_auto_drafts_on_copy_heavy_text_and_keeps_the_answer_but_near_ties(gemma_gguf):
    """auto picks passes of up to 64 rows, where Gemma's logits round by up to ~2 (measured at
    load, ``costs.rounding``): the answer equals plain decoding's, or departs from it only
    where the model's two best tokens are that close."""
    plain, auto = pair(gemma_gguf, n_slots=2, mode="auto")
    try:
        assert auto.speculative == "auto"
        rounding = auto._sched.costs.rounding
        assert rounding > 0  # measured at load: Gemma's attention takes another kernel for several rows
        prompt = GEMMA_COPY[0]
        got = run(auto, request(prompt, max_tokens=48))
        assert_same_but_near_ties(plain, prompt, got.text, 48, bound=2 * rounding)
        # The switch turned drafting on (whether it keeps it on depends on the measured pass
        # costs, which a loaded machine skews: the benchmark measures that, not this test).
        assert got.usage.drafted_tokens > 0 and got.usage.accepted_tokens > 0, got.usage
    finally:
        plain.close()
        auto.close()


def test_grammar_constrained_answers_with_drafts(tiny_gguf):
    grammar = 'root ::= ("hello" | " world" | " the" | " time" | " is")+'
    plain, spec = pair(tiny_gguf, n_slots=2)
    try:
        for prompt in ("hello world hello world hello", "the time is the time is"):
            ref = run(plain, request(prompt, max_tokens=24, grammar=grammar))
            got = run(spec, request(prompt, max_tokens=24, grammar=grammar))
            assert got.text == ref.text
            assert got.text and set(got.text) <= set("hello world the time is")  # the grammar held
        assert spec._sched.spec_totals.drafted > 0
    finally:
        plain.close()
        spec.close()


def test_grammar_cuts_a_draft_before_verification(tiny_gguf):
    s = load(tiny_gguf, n_slots=1, slot_ctx=256, speculative="ngram")
    try:
        from localrun.runtimes.llamacpp.context import llama_lib
        from localrun.runtimes.llamacpp.grammar import ConstrainedSampler

        llama = llama_lib()
        chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        sampler = ConstrainedSampler(llama, s._vocab, 'root ::= " hello world"', chain, s._n_vocab, need=1)
        try:
            good = s.tokenize("hello world", add_special=False)  # SPM: "▁hello▁world", the text " hello world"
            bad = s.tokenize("hello zebra", add_special=False)
            assert sampler.valid_prefix(good) == len(good)
            assert [s.prompting.token_text(t) for t in bad[:3]] == ["\u2581hello", "\u2581", "z"]
            assert sampler.valid_prefix(bad) == 2  # " hello", " " may start " world"; "z" may not
            assert sampler.valid_prefix(good) == len(good)  # checked on a clone: the grammar did not move
        finally:
            sampler.free()
    finally:
        s.close()


def test_stop_strings_logprobs_and_a_draft_that_crosses_the_stop(model):
    path, prompts, max_tokens = model
    plain, spec = pair(path, n_slots=2)
    try:
        for prompt in prompts[:3]:
            full = run(plain, request(prompt, max_tokens=max_tokens)).text
            stop = full[len(full) // 2 : len(full) // 2 + 3]
            if not stop.strip():
                continue
            ref = run(plain, request(prompt, max_tokens=max_tokens, stop=(stop,), logprobs=2))
            got = run(spec, request(prompt, max_tokens=max_tokens, stop=(stop,), logprobs=2))
            assert (got.text, got.finish) == (ref.text, ref.finish) and ref.finish == "stop"
        # logprob entries: one per emitted token, the same tokens, none for rejected drafts
        prompt = prompts[0]
        ref_chunks = list(plain.complete(request(prompt, max_tokens=max_tokens, logprobs=3), Cancel()))
        got_chunks = list(spec.complete(request(prompt, max_tokens=max_tokens, logprobs=3), Cancel()))
        ref_lp = [e for c in ref_chunks for e in c.logprobs]
        got_lp = [e for c in got_chunks for e in c.logprobs]
        assert got_chunks[-1].usage.drafted_tokens > got_chunks[-1].usage.accepted_tokens  # some were rejected
        assert [e["token"] for e in got_lp] == [e["token"] for e in ref_lp]
        assert len(got_lp) == got_chunks[-1].usage.completion_tokens
        # A pass rounds like a batched step (the documented trade): Gemma's logprobs move by up to ~0.1
        # (its attention in F16 takes another kernel for several rows); the tiny F32 model's by ~1e-6.
        assert [e["logprob"] for e in got_lp] == pytest.approx([e["logprob"] for e in ref_lp], abs=0.25)
    finally:
        plain.close()
        spec.close()


def test_cancel_mid_draft_frees_the_slot_and_leaves_the_cache_right(tiny_gguf):
    plain, spec = pair(tiny_gguf, n_slots=2, slot_ctx=256)
    try:
        prompt = TINY_PROMPTS[0]
        ref = run(plain, request(prompt, max_tokens=60)).text
        cancel = Cancel()
        chunks = []
        for chunk in spec.complete(request(prompt, max_tokens=60), cancel):
            chunks.append(chunk)
            if len(chunks) == 5:
                cancel.set()
        assert chunks[-1].finish_reason == "cancelled"
        assert_idle(spec)
        assert run(spec, request(prompt, max_tokens=60)).text == ref
    finally:
        plain.close()
        spec.close()


def test_context_full_mid_draft_ends_at_the_slot_edge(tiny_gguf):
    """With no max_tokens the answer may use the slot's whole context: drafts near its end
    are cut to fit, and the answer ends "length" exactly where plain decoding's does."""
    plain, spec = pair(tiny_gguf, n_slots=2, slot_ctx=64)
    try:
        for prompt in (TINY_PROMPTS[0], TINY_PROMPTS[5]):
            ref = run(plain, request(prompt, max_tokens=None))
            got = run(spec, request(prompt, max_tokens=None))
            assert (got.text, got.finish) == (ref.text, ref.finish)
            assert got.usage.prompt_tokens + got.usage.completion_tokens <= 64
        assert spec._sched.spec_totals.accepted > 0
    finally:
        plain.close()
        spec.close()


def test_auto_drafts_in_every_layout_but_exact_prefix_and_times_its_passes(tiny_gguf):
    """A pass rounds like a batched step (the documented trade), so auto runs in any layout;
    exact_prefix promises bit-exact answers, so there it is off. Drafting times its pass
    sizes at load."""
    from localrun.runtimes.llamacpp.speculative.drafting import CALIBRATED_ROWS

    for opts, expected in (
        ({"speculative": "auto"}, "auto"),
        ({"speculative": "auto", "n_slots": 8}, "auto"),
        ({"speculative": "auto", "exact_prefix": True}, "off"),
        ({"speculative": "ngram"}, "ngram"),
        ({}, "off"),
    ):
        s = load(tiny_gguf, **{"slot_ctx": 128, **opts})
        try:
            assert s.speculative == expected, opts
            costs = s._sched.costs
            if expected == "off":
                assert costs.passes == {}
            else:
                assert set(costs.passes) == set(CALIBRATED_ROWS) and costs.plain[1] > 0
                assert all(t > 0 for t in costs.passes.values())
        finally:
            s.close()


@pytest.mark.gemma
def test_auto_is_off_under_exact_prefix(gemma_gguf):
    s = load(gemma_gguf, n_slots=2, slot_ctx=256, exact_prefix=True)
    try:
        assert s.speculative == "off"
    finally:
        s.close()
