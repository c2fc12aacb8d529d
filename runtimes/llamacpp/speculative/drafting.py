"""Prompt-lookup (n-gram) drafting for the scheduler, and the switch that decides when it pays.

Speculative decoding does less work per token by guessing the next few tokens cheaply and
checking them in one ``llama_decode`` of the sequence: the model's answer at every drafted
position comes out of that one pass, and the tokens it agrees with are kept. On a CPU the
pass over k+1 rows costs more than a one-row step (each row still goes through every
matmul and the whole output layer), so a draft only pays when enough of it is accepted.
Hence three parts:

* :class:`NgramIndex` — where the draft comes from: the sequence's own prompt and output.
  It *follows a source*: once a draft was copied from position p and agreed with, the next
  draft continues from where that copy stands, so a rewritten file is copied line after line
  from the right place even when its lines look alike. When the source stops agreeing, it
  looks again: among the recent places where the last four tokens occurred, the one whose
  match reaches furthest back (then the latest), else the latest 3- or 2-gram match.
* :class:`DraftPolicy` — per sequence, how often a drafted token is right given the one
  before it was (runs of copied text are long, and a miss ends them), learnt from verified
  drafts and from "shadow" drafts: a declined proposal is compared with the tokens plain
  decoding then produces, at no decode cost, so a sequence that turns copy-heavy is noticed.
  The draft length grows by doubling while whole drafts are accepted and falls back to what
  was accepted after a miss, so one lucky match does not buy a 32-row pass.
* :class:`~.pass_costs.DecodeCosts` — what a pass of m rows costs against a plain step, measured on this
  machine: timed at load (:func:`.step.calibrate`) and refined as the scheduler runs.

The policy drafts k tokens only when the expected tokens per pass (1 + p + p^2 + ... + p^k)
divided by the pass's cost in plain steps beats plain decoding by a margin; otherwise the
sequence decodes plainly, so ``auto`` costs only its measurements where drafts do not pay.

Sampling: the scheduler samples the verification rows in order with the request's own
sampler and stops at the first token that differs from the draft, so the sampler sees the
same calls as plain decoding (one per output token, the same RNG draws). With a draft that
is one fixed token per position (n-gram lookup, or a draft model's greedy guess), "sample
from the model and compare" *is* the standard speculative-sampling rule: the drafted token
is kept with probability p(x), and on a rejection the token drawn is distributed as p
without x, renormalised. The output distribution is the model's at any temperature.
Rounding is the trade (docs/architecture.md, "Speculative decoding"): a pass of several
rows goes through batched kernels, whose sums round differently from a one-row step's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localrun.errors import ConfigError
from localrun.runtimes.llamacpp.speculative.pass_costs import DecodeCosts

if TYPE_CHECKING:
    from localrun.types import Plan

log = logging.getLogger(__name__)

#: ``runtime.speculative`` / ``plan.options["speculative"]``.
MODES = ("auto", "off", "ngram", "draft")
#: The sizes a verification pass may have, in rows (the pending token and k = rows - 1
#: drafted ones), each timed at load. Multiples of 4 because ggml's CPU kernels for
#: repacked weights (Q4_0, Q4_K, IQ4_NL, Q8_0 on x86 and ARM) multiply 4 rows at a time and
#: the rest one by one, re-reading the weights for each: measured here (Gemma 3 270M,
#: Q8_0 output layer) 2 rows cost 2.2 one-row steps, 4 rows 2.9, 5 rows 4.5. 2 stays for
#: builds where it is cheap (a GPU, plain kernels). Long copies want long passes: a 48-row
#: pass costs ~14 one-row steps here, 3.4 tokens a step when all is kept.
PASS_ROWS = (2, 4, 8, 12, 16, 24, 32, 48, 64)
#: The sizes timed at load; the others are read off the line through these until used.
CALIBRATED_ROWS = (2, 4, 8, 16, 32)
#: Most tokens drafted at once (a pass is then MAX_DRAFT + 1 rows, one ``llama_decode``).
MAX_DRAFT = PASS_ROWS[-1] - 1
#: ``ngram`` mode (draft whenever a match is found) drafts this many unless told otherwise.
DEFAULT_FIXED_K = 5
MIN_NGRAM, MAX_NGRAM = 2, 4
#: Places remembered per 4-gram, and how far back a match is compared to choose among them.
RECENT_PLACES, BACK_MATCH = 16, 32
#: A draft must promise this much over plain decoding (tokens per unit of time) to be tried.
PAY_MARGIN = 1.10
#: How fast the acceptance estimate follows new outcomes (per drafted token scored).
ALPHA = 0.08
#: What a sequence believes before it has seen anything: drafts are rarely right.
PRIOR = 0.3
#: The longest draft tried first; its pass size doubles after each fully accepted draft.
FIRST_K = 3
#: Tokens an n-gram source must have agreed with (before its n-gram, or since) before its
#: drafts are verified: ordinary text repeats two- to four-token phrases ("of the bicycle")
#: that then go another way, and a pass on such a guess costs ~1-2 steps for nothing
#: (measured: sampled prose, auto 0.88x of off without this rule).
MIN_RUN = 3


def parse_mode(value: object) -> str:
    """``plan.options["speculative"]`` as one of :data:`MODES` (``None`` → ``off``; the
    planner writes the default it chose, see localrun/speculation.py)."""
    if value is None:
        return "off"
    if isinstance(value, bool):
        return "ngram" if value else "off"
    mode = str(value).strip().lower()
    if mode not in MODES:
        raise ConfigError(
            f"unknown speculative mode {value!r}", param="speculative", hint="use one of: " + ", ".join(MODES)
        )
    return mode


class NgramIndex:
    """A sequence's tokens (prompt, then output), where each n-gram (n in [min_n, max_n])
    last ended, the recent places of each max_n-gram, and the source being followed."""

    __slots__ = ("tokens", "_maps", "_places", "_min", "_max", "source", "run")

    def __init__(self, tokens: Iterable[int] = (), *, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM) -> None:
        self.tokens: list[int] = []
        self._min, self._max = min_n, max_n
        self._maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n)}
        self._places: dict[tuple[int, ...], list[int]] = {}
        #: Where the next token is expected to be copied from (None: look again).
        self.source: int | None = None
        #: How many tokens the source has agreed with so far (from before the 4-gram that
        #: found it, then as tokens arrive): a long agreement is a copy in progress.
        self.run = 0
        for token in tokens:
            self._add(token)

    def append(self, token: int) -> None:
        src = self.source
        if src is not None:
            if self.tokens[src] == token:
                self.source, self.run = src + 1, self.run + 1
            else:
                self.source, self.run = None, 0
        self._add(token)

    def _add(self, token: int) -> None:
        toks = self.tokens
        toks.append(token)
        end = len(toks) - 1  # the n-grams ending just before ``token`` now have a continuation
        for n, found in self._maps.items():
            if end >= n:
                found[tuple(toks[end - n : end])] = end
        if end >= self._max:
            places = self._places.setdefault(tuple(toks[end - self._max : end]), [])
            places.append(end)
            if len(places) > RECENT_PLACES:
                del places[0]

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens the sequence is guessed to go on with (empty: no guess)."""
        toks = self.tokens
        if k <= 0:
            return []
        if self.source is None:
            self.source = self._find()
            if self.source is None:
                return []
        out = toks[self.source : self.source + k]
        if len(out) < k:  # the source reaches the end: a loop, whose next turn repeats this one
            period = len(toks) - self.source
            while len(out) < k:
                out.append(out[len(out) - period])
        return out

    def _find(self) -> int | None:
        at: int | None  # a place (loop below), then an n-gram's continuation, if any
        toks, n = self.tokens, len(self.tokens)
        if n >= self._max:
            places = self._places.get(tuple(toks[n - self._max :]))
            if places:
                best: int | None
                best, reach = None, -1
                for at in reversed(places):  # latest first: ties keep the latest
                    back = 0
                    while (
                        back < BACK_MATCH
                        and at - self._max - 1 - back >= 0
                        and toks[at - self._max - 1 - back] == toks[n - self._max - 1 - back]
                    ):
                        back += 1
                    if back > reach:
                        best, reach = at, back
                self.run = reach
                return best
        for m in range(min(self._max - 1, n), self._min - 1, -1):
            at = self._maps[m].get(tuple(toks[n - m :]))
            if at is not None:
                return at
        return None


@dataclass
class Decision:
    k: int
    why: str


class DraftPolicy:
    """Per sequence: p, the chance a drafted token is right when the ones before it were,
    and the draft length the doubling has reached."""

    __slots__ = ("p", "cap", "_shadow", "_at", "fixed_k", "probe_every", "_idle")

    def __init__(self, fixed_k: int | None = None, *, prior: float = PRIOR, probe_every: int = 0) -> None:
        self.p = prior
        self.cap = FIRST_K
        self._shadow: list[int] = []
        self._at = 0
        self.fixed_k = fixed_k
        #: A source with no free shadow drafts (a draft model: a guess costs its steps) is
        #: tried with a short draft after this many declined steps, to notice when it pays again.
        self.probe_every = probe_every
        self._idle = 0

    def record(self, proposed: int, accepted: int, *, verified: bool = True) -> None:
        """Score a draft: ``accepted`` rights then (if short of ``proposed``) one miss."""
        for _ in range(accepted):
            self.p += ALPHA * (1.0 - self.p)
        if accepted < proposed:
            self.p -= ALPHA * 2 * self.p  # a miss weighs more: it ends the run
        if verified:
            self.cap = min(MAX_DRAFT, 2 * self.cap + 1) if accepted >= proposed else max(FIRST_K, accepted)

    def expected(self, k: int, run: int = 0) -> float:
        """Tokens a pass with k drafted tokens is expected to produce: 1 + the sum over i of
        P(the first i drafted tokens are right), taken as p^i, or, for a copy that has agreed
        for ``run`` tokens, as run / (run + i) when that is more (a copy that has lasted
        long is likely to last as long again: the estimate of a run of unknown length)."""
        p, total, chance = self.p, 1.0, 1.0
        for i in range(1, k + 1):
            chance *= p
            total += max(chance, run / (run + i)) if run else chance
        return total

    def choose(
        self,
        available: int,
        costs: DecodeCosts,
        rows_now: int,
        *,
        draft_cost: float | None = 0.0,
        run: int = 0,
        min_run: int = 0,
    ) -> Decision:
        """How many of ``available`` proposed tokens to verify (0: decode plainly).
        ``draft_cost``: seconds each drafted token costs to make (0 for an n-gram lookup);
        ``run``: how long the source of the proposal has agreed (:attr:`NgramIndex.run`),
        which must be at least ``min_run``."""
        if self.fixed_k is not None:
            return Decision(min(available, self.fixed_k), "fixed")
        share = costs.share(max(1, rows_now))
        if share is None or draft_cost is None:
            return Decision(0, "no plain step measured yet")
        if min_run and run < min_run:
            return Decision(0, f"the source agreed for {run} of {min_run} tokens")
        best_k, best_gain = 0, PAY_MARGIN
        for rows in PASS_ROWS:
            k = rows - 1
            if k > min(available, self.cap):
                break
            cost = costs.verify(rows)
            gain = self.expected(k, run) * share / (cost + k * draft_cost) if cost else 0.0
            if gain > best_gain:
                best_k, best_gain = k, gain
        if best_k:
            self._idle = 0
            return Decision(best_k, f"gain {best_gain:.2f}")
        self._idle += 1
        if self.probe_every and self._idle >= self.probe_every and available >= FIRST_K:
            self._idle = 0
            return Decision(FIRST_K, "probe")
        return Decision(0, "does not pay")

    # --- shadow drafts ---------------------------------------------------------------------

    def shadow(self, proposal: list[int]) -> None:
        """Remember a declined proposal, to be checked against the next tokens."""
        if not self._shadow and proposal:
            self._shadow, self._at = list(proposal[:MAX_DRAFT]), 0

    def observe(self, token: int) -> None:
        """A token plain decoding produced: score the pending shadow draft with it, token by
        token (a long copy is noticed after a few tokens, not at the end of its draft)."""
        if not self._shadow:
            return
        right = token == self._shadow[self._at]
        self.record(1, 1 if right else 0, verified=False)
        self._at += 1
        if not right or self._at == len(self._shadow):
            self._shadow, self._at = [], 0

    def drop_shadow(self) -> None:
        self._shadow, self._at = [], 0


#: What a draft model's tokens are believed to be worth before any is verified (a draft
#: model of the target's family guesses most ordinary tokens right), and how often one that
#: stopped paying is tried again.
MODEL_PRIOR, MODEL_PROBE_EVERY = 0.6, 16


class SpecState:
    """One request's drafting: its n-gram index, a policy per draft source (the n-gram
    lookup; the draft model, when one is loaded) and its counts."""

    __slots__ = ("index", "policy", "model_policy", "source", "drafted", "accepted", "passes")

    def __init__(self, prompt: list[int], *, fixed_k: int | None) -> None:
        self.index = NgramIndex(prompt)
        self.policy = DraftPolicy(fixed_k)
        self.model_policy = DraftPolicy(fixed_k, prior=MODEL_PRIOR, probe_every=MODEL_PROBE_EVERY)
        self.source = "ngram"  # where the draft being verified came from
        self.drafted = 0
        self.accepted = 0
        self.passes = 0

    def pushed(self, token: int) -> None:
        """A token became part of the output."""
        self.index.append(token)
        self.policy.observe(token)

    def verified(self, drafted: int, accepted: int) -> None:
        self.policy.drop_shadow()
        (self.model_policy if self.source == "model" else self.policy).record(drafted, accepted)
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


def speculation(plan: Plan, n_swa: int, memory: str | None = None) -> tuple[str, int | None]:
    """(mode the scheduler runs, tokens per draft in ``ngram`` mode) from ``plan.options``; off for a
    ``memory`` that cannot be cut back (checkpoints.memory_kind: "recurrent", "hybrid").

    Raises:
        ConfigError: an unknown mode, a bad ``draft_k``, or ``draft`` with no draft model
            (``plan.options["draft"]``, the path the planner found or was given).
    """
    mode = parse_mode(plan.options.get("speculative"))
    if mode == "draft" and not plan.options.get("draft"):
        raise ConfigError(
            "speculative mode 'draft' needs a draft model, and none was given or found beside the model",
            param="draft",
            hint="pass --draft MODEL (a model in the store or a .gguf file), put a GGUF "
            "whose name contains 'draft' next to the model, or use --speculative auto",
        )
    try:
        k = int(plan.options.get("draft_k") or DEFAULT_FIXED_K)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"draft_k must be a number, not {plan.options.get('draft_k')!r}", param="draft_k") from exc
    if not 1 <= k <= MAX_DRAFT:
        raise ConfigError(
            f"draft_k must be 1-{MAX_DRAFT}, not {k}",
            param="draft_k",
            hint=f"a pass verifies at most {MAX_DRAFT} drafted tokens",
        )
    if mode != "off" and n_swa > 0 and plan.options.get("swa_full") is False:
        # Without a full-size cache a sliding-window layer may already have overwritten what a
        # rejected draft's removal would need back.
        log.info("speculative decoding off: the sliding-window cache is not full-size (swa_full=false)")
        mode = "off"
    if memory in ("recurrent", "hybrid") and mode != "off":
        # A rejected draft's tokens cannot be taken back out of a recurrent state.
        log.info("speculative decoding off: %s memory cannot be cut back after a rejected draft", memory)
        mode = "off"
    return mode, k
