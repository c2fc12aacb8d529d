"""Shared pieces of the speculative-decoding tests: sessions with and without drafting,
prompts that make the n-gram drafts right (copy-heavy) and wrong (free text)."""

from __future__ import annotations

from tests.batching.conftest import load

#: Copy-heavy prompts: the answer repeats what the prompt holds, so n-gram drafts are right.
GEMMA_COPY = [
    "Repeat exactly: The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.\nAnswer:",
    "Copy this list: apple, banana, cherry, date, elderberry, fig, grape.\nCopy: apple, banana,",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
]
GEMMA_FREE = ["The capital of France is", "A haiku about the sea:\n"]
#: The tiny random model falls into loops, and n-grams of its own output repeat.
TINY_PROMPTS = ["hello world " * 5, "the time is now the time is", "a b c d e f g a b c", "zebra",
                "what was that what was", "hello the time " * 6]


def pair(path, *, slot_ctx: int = 512, n_slots: int = 4, **opts):
    """(plain session, session that drafts in ``ngram`` mode at every match), same layout."""
    plain = load(path, n_slots=n_slots, slot_ctx=slot_ctx, speculative="off", **opts)
    try:
        spec = load(path, n_slots=n_slots, slot_ctx=slot_ctx, speculative=opts.pop("mode", "ngram"), **opts)
    except BaseException:
        plain.close()
        raise
    return plain, spec
