"""At temperature 1, drafting leaves the output distribution the model's.

With a draft of one fixed token per position (n-gram lookup), sampling each verification
row with the request's sampler and stopping at the first disagreement *is* the standard
speculative-sampling rule (keep the drafted x with probability p(x), else draw from p
without x). Two checks on the tiny model: seeded answers are the same with and without
drafts (the sampler is called exactly as often, in the same order), and answers drawn
with different seeds have the same distribution (a chi-square test of homogeneity).
"""

from __future__ import annotations

import collections
import math

import pytest

from tests.batching.conftest import request, run
from tests.conftest import needs_llama
from tests.speculative.conftest import pair

pytestmark = [needs_llama, pytest.mark.llama]

SAMPLES = 300
#: A prompt whose n-grams the tiny model's sampled answers often continue: drafts are
#: verified at most steps, and both kept and rejected.
P0 = "what was that"


def _chi2_sf(x: float, df: int) -> float:
    """P(chi2_df > x), Wilson-Hilferty's normal approximation (good to ~1e-3 for df >= 3)."""
    z = ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _homogeneity(a: collections.Counter, b: collections.Counter, min_expected: float = 5.0) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom for two samples of answers; answers
    too rare for the test are pooled into one category."""
    na, nb = sum(a.values()), sum(b.values())
    keys = [k for k in set(a) | set(b) if (a[k] + b[k]) * min(na, nb) / (na + nb) >= min_expected]
    cats = [(a[k], b[k]) for k in keys]
    rest = (na - sum(x for x, _ in cats), nb - sum(y for _, y in cats))
    if sum(rest):
        cats.append(rest)
    stat = 0.0
    for x, y in cats:
        tot = x + y
        for obs, n in ((x, na), (y, nb)):
            exp = tot * n / (na + nb)
            stat += (obs - exp) ** 2 / exp
    return stat, len(cats) - 1


def test_sampled_answers_keep_their_distribution_with_drafts(tiny_gguf):
    plain, spec = pair(tiny_gguf, n_slots=1, slot_ctx=256)
    try:
        cont = run(plain, request(P0, max_tokens=8)).text
        prompt = f"{P0}{cont} {P0}"

        def sample(session, seed):
            return run(
                session, request(prompt, temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=seed, max_tokens=4)
            )

        same = [(sample(plain, s).text, sample(spec, s).text) for s in range(40)]
        assert all(a == b for a, b in same), "a seeded answer changed with drafts"
        drawn = [sample(spec, s) for s in range(1000, 1000 + SAMPLES)]
        drafted = sum(r.usage.drafted_tokens for r in drawn)
        accepted = sum(r.usage.accepted_tokens for r in drawn)
        assert accepted > 20 and drafted - accepted > 20, (drafted, accepted)  # both branches of the rule ran
        with_drafts = collections.Counter(r.text for r in drawn)
        without = collections.Counter(sample(plain, s).text for s in range(5000, 5000 + SAMPLES))
        stat, df = _homogeneity(with_drafts, without)
        assert df >= 3
        assert _chi2_sf(stat, df) > 1e-3, (stat, df, with_drafts.most_common(5), without.most_common(5))
    finally:
        plain.close()
        spec.close()


def test_the_chi_square_check_can_fail():
    """The homogeneity test itself tells two different distributions apart at this sample size."""
    a = collections.Counter({"x": 150, "y": 100, "z": 50, "w": 0})
    b = collections.Counter({"x": 100, "y": 100, "z": 60, "w": 40})
    stat, df = _homogeneity(a, b)
    assert _chi2_sf(stat, df) < 1e-3
    stat, df = _homogeneity(a, a)
    assert stat == 0 and _chi2_sf(stat + 1e-9, df) > 0.99
