"""What ``localrun plan`` says about speculative decoding, and the mode a llama.cpp plan carries.

Kept apart from the planner: it is the one rule about drafting the planner needs, and its
words are what ``plan`` prints and the TUI shows.
"""

from __future__ import annotations

from localrun.errors import ConfigError

SPECULATION_WHY = {
    "auto": "speculative decoding auto: n-gram drafts from the prompt and the answer, verified in one pass, "
            "per request only while they pay (off where a pass is not bit-exact)",
    "ngram": "speculative decoding ngram, as asked: drafts at every n-gram match, whether it pays or not",
    "off": "speculative decoding off, as asked",
    "draft": "speculative decoding with a draft model, as asked: not available in this version (loading fails)",
}


def speculation_plan(asked: str | None, slots: int) -> tuple[str, str]:
    """The ``speculative`` option for a llama.cpp plan, and the reason line that says why.

    Raises:
        ConfigError: an unknown mode.
    """
    if not asked:
        return "off", ("speculative decoding off by default: not yet shown never slower on ordinary text "
                       "(--speculative auto drafts only while it pays)")
    mode = asked.strip().lower()
    if mode not in SPECULATION_WHY:
        raise ConfigError(f"unknown speculative mode {asked!r}", param="speculative",
                          hint="use one of: " + ", ".join(SPECULATION_WHY))
    why = SPECULATION_WHY[mode]
    if mode == "auto" and slots > 1:
        why += "; beside other requests a draft must beat the request's share of a batched step"
    return mode, why
