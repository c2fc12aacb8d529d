"""Shared pieces of the speculative-decoding tests: sessions with and without drafting,
prompts that make the n-gram drafts right (copy-heavy) and wrong (free text)."""

from __future__ import annotations

from tests.batching.conftest import load

#: Copy-heavy prompts: the answer repeats what the prompt holds, so n-gram drafts are right.
GEMMA_COPY = [
    "Repeat exactly: The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy "
    "dog.\nAnswer:",
    "Copy this list: apple, banana, cherry, date, elderberry, fig, grape.\nCopy: apple, banana,",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
]
GEMMA_FREE = ["The capital of France is", "A haiku about the sea:\n"]
#: The tiny random model falls into loops, and n-grams of its own output repeat.
TINY_PROMPTS = [
    "hello world " * 5,
    "the time is now the time is",
    "a b c d e f g a b c",
    "zebra",
    "what was that what was",
    "hello the time " * 6,
]


def pair(path, *, slot_ctx: int = 512, n_slots: int = 4, **opts):
    """(plain session, session that drafts in ``ngram`` mode at every match), same layout."""
    plain = load(path, n_slots=n_slots, slot_ctx=slot_ctx, speculative="off", **opts)
    try:
        spec = load(path, n_slots=n_slots, slot_ctx=slot_ctx, speculative=opts.pop("mode", "ngram"), **opts)
    except BaseException:
        plain.close()
        raise
    return plain, spec


def assert_same_but_near_ties(plain, prompt: str, got: str, max_tokens: int, bound: float) -> None:
    """``got`` is plain greedy decoding's answer, or departs from it only at a token where the
    plain answer's two best logits are within ``bound`` (the documented trade: a verification
    pass rounds differently from one-row steps, so it may take the other of two near-equal
    tokens; after that the answers are different texts)."""
    from localrun.types import Cancel, CompletionRequest, Sampling

    req = CompletionRequest(prompt=prompt, sampling=Sampling(temperature=0.0, max_tokens=max_tokens, logprobs=2))
    entries = [e for c in plain.complete(req, Cancel()) for e in c.logprobs]
    ref = "".join(e["token"] for e in entries)
    if got == ref:
        return
    at = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
    seen = 0
    for entry in entries:
        if seen + len(entry["token"]) > at:
            tops = entry["top_logprobs"]
            margin = tops[0]["logprob"] - tops[1]["logprob"]
            assert margin < bound, (
                f"the answers part at {entry['token']!r} (of {ref!r}), where the model's top two "
                f"are {margin:.3f} apart, beyond rounding ({bound:.3f})"
            )
            return
        seen += len(entry["token"])
    raise AssertionError(f"{got!r} is longer than plain decoding's {ref!r}")
