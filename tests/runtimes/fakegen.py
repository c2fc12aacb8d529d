"""A deterministic stand-in for a language model, shared by the fake Ollama server and
the ``mlc_llm serve`` stand-in: words drawn from a seeded generator, one word per token,
with stop strings applied the way servers apply them (the text before the stop is sent,
the stop itself never is)."""

from __future__ import annotations

import hashlib
import random
import zlib
from collections.abc import Iterator, Sequence

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()


def count_tokens(text: str) -> int:
    """The fake tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def words(prompt: str, seed: int | None) -> Iterator[str]:
    """An endless deterministic stream of tokens for ``prompt`` (or ``seed``)."""
    rng = random.Random(seed if seed is not None else zlib.crc32(prompt.encode("utf-8")))
    first = True
    while True:
        word = rng.choice(WORDS)
        yield word if first else " " + word
        first = False


def generate(
    prompt: str, *, seed: int | None, max_tokens: int | None, stops: Sequence[str] = ()
) -> Iterator[tuple[str, str | None]]:
    """Yield ``(text, None)`` per token and finally ``("", "stop" | "length")``."""
    stops = [s for s in stops if s]
    pending = ""
    for n, word in enumerate(words(prompt, seed), start=1):
        pending += word
        hits = [i for i in (pending.find(s) for s in stops) if i >= 0]
        if hits:
            cut = pending[: min(hits)]
            if cut:
                yield cut, None
            yield "", "stop"
            return
        keep = max((k for s in stops for k in range(1, len(s)) if pending.endswith(s[:k])), default=0)
        out, pending = pending[: len(pending) - keep], pending[len(pending) - keep :]
        if out:
            yield out, None
        if max_tokens is not None and n >= max_tokens:
            if pending:
                yield pending, None
            yield "", "length"
            return


def embedding(text: str, dim: int = 8) -> list[float]:
    """A deterministic unit-free vector for ``text``."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return [(b - 128) / 128 for b in digest[:dim]]
