"""Prompt-lookup (n-gram) drafting for the scheduler, and the switch that decides when it pays.

Speculative decoding does less work per token by guessing the next few tokens cheaply and
checking them in one ``llama_decode`` of the sequence: the model's answer at every drafted
position comes out of that one pass, and the tokens it agrees with are kept. On a CPU the
pass over k+1 rows costs more than a one-row step (each row still goes through every
matmul), so a draft only pays when enough of it is accepted. Hence three parts:

* :class:`NgramIndex` — where the draft comes from: the longest recent n-gram of the
  sequence's own prompt and output that ends like the sequence does now; the tokens that
  followed it are the guess. Copy-heavy text (a file rewritten with a small change, a
  quoted passage) is guessed well; free prose rarely.
* :class:`DraftPolicy` — per sequence, how far drafts of each length have been right. It
  learns also while *not* drafting: a proposal it declined is compared with the tokens
  plain decoding then produces ("shadow" drafts), at no decode cost, so a sequence that
  turns copy-heavy is noticed, and one that stops being so is dropped.
* :class:`DecodeCosts` — what a verification pass of m rows costs against a plain step,
  measured on this machine as the scheduler runs (a one-row step, plus a cost per extra row).

The policy drafts k tokens only when the expected tokens per pass, 1 + sum of P(first i
drafted tokens right), divided by the pass's cost in plain steps, beats plain decoding by a
margin; otherwise the sequence decodes plainly, so ``auto`` is never slower by design
beyond the cost of the measurements themselves.

Exactness: the scheduler samples the verification rows in order with the request's own
sampler and stops at the first token that differs from the draft, so the sampler sees the
same calls as plain decoding (one per output token, the same RNG draws). With a draft that
is one fixed token per position (n-gram lookup), "sample from the model and compare" *is*
the standard speculative-sampling rule: the drafted token is kept with probability p(x),
and on a rejection the token drawn is distributed as p without x, renormalised. The
output distribution is the model's at any temperature.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from localrun.errors import ConfigError, UnsupportedFeature

log = logging.getLogger(__name__)

#: ``runtime.speculative`` / ``plan.options["speculative"]``.
MODES = ("auto", "off", "ngram", "draft")
#: Most tokens drafted at once: k+1 rows per verification pass stay within the 1-7 row
#: micro-batches the batch-invariance rule of :mod:`.scheduler` allows.
MAX_DRAFT = 6
#: ``ngram`` mode (draft whenever a match is found) drafts this many unless told otherwise.
DEFAULT_FIXED_K = 5
MIN_NGRAM, MAX_NGRAM = 2, 4
#: A draft must promise this much over plain decoding (tokens per unit of time) to be tried.
PAY_MARGIN = 1.10
#: How fast the acceptance estimates follow new outcomes.
ALPHA = 0.3
#: What a sequence believes before it has seen anything: drafts are rarely right.
PRIOR = 0.25


def parse_mode(value) -> str:
    """``plan.options["speculative"]`` as one of :data:`MODES` (``None`` → ``off``, the default
    until a quiet benchmark shows ``auto`` never slower: see the planner's reason line)."""
    if value is None:
        return "off"
    if isinstance(value, bool):
        return "ngram" if value else "off"
    mode = str(value).strip().lower()
    if mode not in MODES:
        raise ConfigError(f"unknown speculative mode {value!r}", param="speculative",
                          hint="use one of: " + ", ".join(MODES))
    return mode


class NgramIndex:
    """A sequence's tokens (prompt, then output) and, for each n in [min_n, max_n], where
    each n-gram last ended. ``propose`` finds the longest n-gram ending the sequence that
    occurred before and returns what followed its latest earlier occurrence."""

    __slots__ = ("tokens", "_maps", "_min", "_max")

    def __init__(self, tokens=(), *, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM) -> None:
        self.tokens: list[int] = []
        self._min, self._max = min_n, max_n
        self._maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        toks = self.tokens
        toks.append(token)
        end = len(toks) - 1  # the n-grams ending just before ``token`` now have a continuation
        for n, found in self._maps.items():
            if end >= n:
                found[tuple(toks[end - n:end])] = end

    def propose(self, k: int) -> list[int]:
        toks = self.tokens
        for n in range(min(self._max, len(toks)), self._min - 1, -1):
            at = self._maps[n].get(tuple(toks[len(toks) - n:]))
            if at is not None:
                return toks[at:at + k]
        return []


class DecodeCosts:
    """Measured seconds of decode calls: plain steps by rows (one row per sequence) and
    verification passes by rows (one sequence). A verification pass of m rows is modelled
    as ``one + extra * (m - 1)``, fitted as passes are timed; before any is, ``extra`` is
    assumed to be ``PRIOR_EXTRA`` of a one-row step."""

    PRIOR_EXTRA = 0.35

    def __init__(self) -> None:
        self.plain: dict[int, float] = {}
        self.extra: float | None = None

    def observe_plain(self, rows: int, seconds: float) -> None:
        self.plain[rows] = _ewma(self.plain.get(rows), seconds)

    def observe_verify(self, rows: int, seconds: float) -> None:
        one = self.plain.get(1)
        if one is None or rows < 2:
            return
        self.extra = _ewma(self.extra, max(0.0, (seconds - one) / (rows - 1)))

    def share(self, rows: int) -> float | None:
        """Seconds one sequence costs in a plain step of ``rows`` sequences."""
        got = self.plain.get(rows)
        if got is None:
            near = [r for r in self.plain if r <= rows]
            if not near:
                return None
            got = self.plain[max(near)]
            rows = max(near)
        return got / rows

    def verify(self, rows: int) -> float | None:
        one = self.plain.get(1)
        if one is None:
            return None
        extra = self.extra if self.extra is not None else self.PRIOR_EXTRA * one
        return one + extra * (rows - 1)


def _ewma(old: float | None, new: float, alpha: float = 0.2) -> float:
    return new if old is None else old + alpha * (new - old)


@dataclass
class Decision:
    k: int
    why: str


class DraftPolicy:
    """Per sequence: P(the first i drafted tokens are all right), i = 1..MAX_DRAFT, learnt
    from verified drafts and from shadow drafts (declined proposals checked against what
    plain decoding produced)."""

    __slots__ = ("right", "_shadow", "_at", "fixed_k")

    def __init__(self, fixed_k: int | None = None) -> None:
        self.right = [PRIOR ** (i + 1) for i in range(MAX_DRAFT)]
        self._shadow: list[int] = []
        self._at = 0
        self.fixed_k = fixed_k

    def record(self, proposed: int, accepted: int) -> None:
        for i in range(min(proposed, MAX_DRAFT)):
            self.right[i] += ALPHA * ((1.0 if accepted > i else 0.0) - self.right[i])

    def expected(self, k: int) -> float:
        """Tokens a verification pass with k drafted tokens is expected to produce."""
        return 1.0 + sum(self.right[:k])

    def choose(self, available: int, costs: DecodeCosts, rows_now: int) -> Decision:
        """How many of ``available`` proposed tokens to verify (0: decode plainly)."""
        if self.fixed_k is not None:
            return Decision(min(available, self.fixed_k), "fixed")
        share = costs.share(max(1, rows_now))
        if share is None:
            return Decision(0, "no plain step measured yet")
        best_k, best_gain = 0, PAY_MARGIN
        for k in range(1, min(available, MAX_DRAFT) + 1):
            cost = costs.verify(k + 1)
            gain = self.expected(k) * share / cost if cost else 0.0
            if gain > best_gain:
                best_k, best_gain = k, gain
        return Decision(best_k, f"gain {best_gain:.2f}" if best_k else "does not pay")

    # --- shadow drafts ---------------------------------------------------------------------

    def shadow(self, proposal: list[int]) -> None:
        """Remember a declined proposal, to be checked against the next tokens."""
        if not self._shadow and proposal:
            self._shadow, self._at = list(proposal[:MAX_DRAFT]), 0

    def observe(self, token: int) -> None:
        """A token plain decoding produced: score the pending shadow draft with it."""
        if not self._shadow:
            return
        if token == self._shadow[self._at]:
            self._at += 1
            if self._at < len(self._shadow):
                return
        self.record(len(self._shadow), self._at)
        self._shadow, self._at = [], 0

    def drop_shadow(self) -> None:
        self._shadow, self._at = [], 0


class SpecState:
    """One request's drafting: its n-gram index, its policy and its counts."""

    __slots__ = ("index", "policy", "drafted", "accepted", "passes")

    def __init__(self, prompt: list[int], *, fixed_k: int | None) -> None:
        self.index = NgramIndex(prompt)
        self.policy = DraftPolicy(fixed_k)
        self.drafted = 0
        self.accepted = 0
        self.passes = 0

    def pushed(self, token: int) -> None:
        """A token became part of the output."""
        self.index.append(token)
        self.policy.observe(token)

    def verified(self, drafted: int, accepted: int) -> None:
        self.policy.drop_shadow()
        self.policy.record(drafted, accepted)
        self.drafted += drafted
        self.accepted += accepted
        self.passes += 1


@dataclass
class SpecTotals:
    """What drafting did in one scheduler, over its life (for logs and tests)."""

    passes: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.passes += 1
        self.drafted += drafted
        self.accepted += accepted


def speculation(plan, n_swa: int) -> tuple[str, int | None]:
    """(mode the scheduler runs, tokens per draft in ``ngram`` mode) from ``plan.options``.

    Raises:
        ConfigError: an unknown mode or a bad ``draft_k``.
        UnsupportedFeature: ``draft`` (a draft model), which this runtime does not load yet.
    """
    mode = parse_mode(plan.options.get("speculative"))
    if mode == "draft":
        raise UnsupportedFeature("speculative mode 'draft' (a draft model) is not available in the llama.cpp runtime yet",
                                 param="speculative", hint="use auto or ngram (prompt lookup), or off")
    try:
        k = int(plan.options.get("draft_k") or DEFAULT_FIXED_K)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"draft_k must be a number, not {plan.options.get('draft_k')!r}", param="draft_k") from exc
    if not 1 <= k <= MAX_DRAFT:
        raise ConfigError(f"draft_k must be 1-{MAX_DRAFT}, not {k}", param="draft_k",
                          hint=f"more rows per pass leave the batch-invariant range ({MAX_DRAFT + 1} rows)")
    if mode != "off" and n_swa > 0 and plan.options.get("swa_full") is False:
        # Without a full-size cache a sliding-window layer may already have overwritten what a
        # rejected draft's removal would need back.
        log.info("speculative decoding off: the sliding-window cache is not full-size (swa_full=false)")
        mode = "off"
    return mode, k
