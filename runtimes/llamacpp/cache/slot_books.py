"""The prefix cache's books for what llama-server's slot API does to one named slot.

Two things reach a slot from outside the cache's own placement: a request pinned to a slot
(``id_slot``), and a slot file restored or a slot erased (``POST /slots/{id}``). Both must
leave :class:`~.prefix.PrefixCache`'s books true: ``slot.tokens`` lists exactly the tokens
whose KV the sequence holds, and the radix index knows it, or the next request would reuse
KV that is not there (or miss KV that is).

Functions over the cache rather than methods of it, so the placement policy stays one file;
they use its placement steps (``_reusable``, ``_cut``, ``_copy``, ``_restore``, ``_evict``).
"""

from __future__ import annotations

from collections.abc import Sequence

from localrun.runtimes.llamacpp.cache.prefix import MIN_COPY, PrefixCache, Slot

# ruff: noqa: SLF001 - these functions are the cache's own books, kept in a file of their own


def adopt(cache: PrefixCache, slot: Slot, tokens: Sequence[int]) -> None:
    """``slot``'s KV was replaced outside the cache (a slot file was restored into it): it holds
    exactly ``tokens`` now, and any request sharing their prefix may reuse them."""
    slot.tokens[:] = tokens
    slot.used_at = next(cache._clock)
    if slot.tokens:
        cache.index.set(slot.seq, slot.tokens)
    else:
        cache.index.discard(slot.seq)


def acquire_at(cache: PrefixCache, prompt: Sequence[int], seq: int) -> tuple[Slot, int] | None:
    """Slot ``seq`` for ``prompt`` (a request's ``id_slot``), holding the longest reusable prefix
    found anywhere: cut in place when that slot has it, else copied from the slot that does,
    else restored from host RAM. None while ``seq`` is busy.

    What ``seq`` held goes as an eviction does (to host RAM first when the tier is on), so
    pinning a request never loses more than placing it would."""
    slot = cache.slots[seq]
    if slot.busy:
        return None
    keep, owners = cache._reusable(prompt)
    if keep and seq in owners:
        kept = cache._cut(slot, keep, reuse_from=slot)
    else:
        if slot.tokens:
            cache._evict(slot)  # first: an eviction may reshuffle host RAM, so look again after it
            keep, owners = cache._reusable(prompt)
        by_seq = {s.seq: s for s in cache.slots}
        sources = sorted(owners, key=lambda o: (o not in by_seq, o))
        if not sources or keep < MIN_COPY:
            kept = cache._cut(slot, 0, reuse_from=None)
        elif sources[0] in by_seq:
            kept = cache._copy(by_seq[sources[0]], slot, keep)
        else:
            kept = cache._restore(sources[0], slot, keep)
    slot.busy = True
    slot.used_at = next(cache._clock)
    return slot, kept
