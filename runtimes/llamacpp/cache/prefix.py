"""Prefix reuse across the sequences (slots) of one llama.cpp context.

A :class:`~.radix.RadixIndex` records which token sequences are held by whom: every slot's KV
content, and, when a host-RAM tier is configured, sequences saved from evicted slots. A new
request asks :class:`PrefixCache` for a slot; the cache finds the longest cached prefix of
its prompt and makes the chosen slot hold exactly that prefix:

* in place, when the prefix sits in an idle slot (cut its tail, nothing copied);
* copied from another slot (busy or idle) with ``llama_memory_seq_cp``;
* restored from host RAM with the per-sequence state API;
* restored from disk (:mod:`.prefix_disk`), where host RAM and closing sessions spill to.

Finished conversations stay in their slots until a newcomer needs the room; what goes is
the least recently used content (saved to host RAM first if the tier is on and nothing else
holds it). Which *slot* a newcomer gets is chosen to keep busy slots consecutive, since
llama.cpp splits a decode batch at every gap in sequence ids; content moves aside when
needed. The cache only decides and keeps the books; the KV operations themselves go through
a small :class:`KvOps` interface, so the policy is tested without llama.cpp.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from localrun.runtimes.llamacpp.cache.host_tier import HOST_MIN_TOKENS, HostTier
from localrun.runtimes.llamacpp.cache.kv_file import Blob
from localrun.runtimes.llamacpp.cache.leaving import leaving_states, saved_cuttable, uncut_reuse
from localrun.runtimes.llamacpp.cache.prefix_disk import FLUSH_TIMEOUT_S, DiskSpill
from localrun.runtimes.llamacpp.cache.radix import RadixIndex
from localrun.runtimes.llamacpp.cache.slot import CacheStats, KvOps, Slot
from localrun.runtimes.llamacpp.media.prompt import media_safe_cut

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.kv_disk import DiskTier
    from localrun.runtimes.llamacpp.cache.state_memory import ReadyBuffers

log = logging.getLogger(__name__)

#: A copy or a host restore costs a memcpy of the whole slot; below this, prefilling is as cheap.
MIN_COPY = 32
#: Shorter shared prefixes are not reused at all: they save a few milliseconds of prefill but
#: pin the request to a slot that may split the decode batch (see ``_victim``).
MIN_REUSE = 16
#: An idle slot whose content goes this far past the shared prefix is copied from, not cut.
KEEP_TAIL = 64
#: Disk entries written this close to the newest one count as one slot's leaving (:meth:`PrefixCache.warm`).
WARM_BATCH_S = 5.0


class PrefixCache:
    """Hands out slots with the longest cached prefix of a prompt already in them.

    ``min_tail`` tokens of every prompt are always evaluated again (at least one, for its
    logits; more where the arithmetic of a short prefill chunk differs from a long one, see
    the scheduler), and a shared prefix shorter than that or than ``MIN_REUSE`` is not reused
    (``reuse=False``: no prefix is). ``host_budget`` bytes of host RAM keep evicted sequences (0: off);
    ``disk`` (a ``kv_disk.DiskTier``) keeps what host RAM evicts, and every prefix at :meth:`persist`.
    """

    def __init__(
        self,
        n_slots: int,
        ops: KvOps,
        *,
        min_tail: int = 1,
        host_budget: int = 0,
        reuse: bool = True,
        disk: DiskTier | None = None,
        buffers: ReadyBuffers | None = None,
    ) -> None:
        self.slots = [Slot(seq) for seq in range(n_slots)]
        self._ops = ops
        self._min_tail = max(1, min_tail)
        self._reuse = reuse
        owner_ids = itertools.count(n_slots)  # owner ids: slots are 0..n-1, saved states after
        self._clock = itertools.count(1)
        self.index = RadixIndex()
        self._counts = {"reused_in_place": 0, "copied": 0, "restored": 0, "relocated": 0}
        #: What evicted slots leave in host RAM (host_tier.py).
        self.host = HostTier(
            ops, self.index, budget=host_budget, owner_ids=owner_ids, clock=self._clock, min_tail=self._min_tail
        )
        whole_only = not saved_cuttable(ops)
        self.disk = DiskSpill(disk, self.index, owner_ids, whole_only=whole_only) if disk is not None else None
        #: Memory made ready for what an idle slot would leave with (state_memory.ReadyBuffers), or None.
        self._buffers = buffers

    # --- what the scheduler calls -------------------------------------------------------------

    def acquire(self, prompt: Sequence[int], *, spare: frozenset[int] = frozenset()) -> tuple[Slot, int] | None:
        """A slot for ``prompt`` holding its longest reusable prefix, and that prefix's length.
        None when every slot is busy. Idle slots in ``spare`` (what other waiting requests
        will reuse) are evicted only when no other idle slot is left."""
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        keep, owners = self._reusable(prompt)
        parted = self.index.longest(prompt)[0] if not saved_cuttable(self._ops) else 0  # leaving.py
        slot, keep = self._place(prompt, keep, owners, idle, spare)
        if self.disk is not None and keep == 0 and len(prompt) >= HOST_MIN_TOKENS:
            self.disk.missed()
        slot.warm_from = None  # its content is this request's now
        slot.parted = parted if HOST_MIN_TOKENS <= parted < len(prompt) else None
        slot.busy = True
        slot.used_at = next(self._clock)
        return slot, keep

    def wanted(self, prompt: Sequence[int]) -> int | None:
        """The idle slot ``prompt`` would reuse in place, if any."""
        keep, owners = self._reusable(prompt)
        return next((o for o in sorted(owners) if keep and o < len(self.slots) and not self.slots[o].busy), None)

    def _reusable(self, prompt: Sequence[int]) -> tuple[int, frozenset[int]]:
        limit = len(prompt) - self._min_tail
        if limit < max(MIN_REUSE, self._min_tail) or not self._reuse:
            return 0, frozenset()
        found, owners = self.index.longest(prompt)
        keep = media_safe_cut(prompt, min(found, limit))  # never inside an image's chunk (media/prompt.py)
        if not saved_cuttable(self._ops):  # a saved state restores only whole (leaving.py)
            by_seq = {s.seq: s for s in self.slots}
            keep, owners = uncut_reuse(prompt, keep, owners, limit, self._ops, self.index, by_seq, self._saved_length)
        if keep < max(MIN_REUSE, self._min_tail) or not owners:  # a few tokens are not worth it
            return 0, frozenset()
        return keep, owners

    def _saved_length(self, owner: int) -> int | None:
        """How many tokens a saved state (host RAM or disk) holds; None for a slot."""
        if owner in self.host.entries:
            return len(self.host.entries[owner].tokens)
        if self.disk is not None and owner in self.disk:
            return len(self.disk.tokens(owner))
        return None

    def extended(self, slot: Slot, turn: Callable[[], int | None] | None = None) -> None:
        """``slot.tokens`` grew (a prefill chunk landed): others may now reuse it. ``turn``: where
        its prompt's last user message begins (a state worth leaving there, leaving.py)."""
        slot.prompt_end = len(slot.tokens)
        slot.turn = turn
        self.index.set(slot.seq, slot.tokens)

    def release(self, slot: Slot) -> None:
        """The request in ``slot`` ended; its KV stays for whoever shares its prefix next."""
        slot.busy = False
        slot.used_at = next(self._clock)
        self.index.set(slot.seq, slot.tokens)
        if self._buffers is not None:
            self._buffers.want(
                slot.seq, self.host.leaving_count(slot, self.disk) if self.host.keeps(slot, self.disk) else 0
            )

    def drop(self, slot: Slot) -> None:
        """Forget and clear ``slot`` (its KV is unknown after a failed decode)."""
        if self._buffers is not None:
            self._buffers.forget(slot.seq)
        self._ops.clear(slot.seq)
        slot.tokens.clear()
        slot.busy = False
        self.index.discard(slot.seq)

    def evict_idle(self) -> int:
        """Clear every idle slot (a unified KV pool ran full); returns how many were cleared."""
        n = 0
        for slot in self.slots:
            if not slot.busy and slot.tokens:
                self._evict(slot)
                n += 1
        return n

    # --- llama-server's slot API: a request pinned to a slot, a slot file restored ---------------

    def acquire_at(self, prompt: Sequence[int], seq: int) -> tuple[Slot, int] | None:
        """Slot ``seq`` for ``prompt`` (a request's ``id_slot``), holding the longest reusable prefix
        found anywhere: cut in place when that slot has it, else copied from the slot that does,
        else restored from host RAM. None while ``seq`` is busy.

        What ``seq`` held goes as an eviction does (to host RAM first when the tier is on), so
        pinning a request never loses more than placing it would."""
        slot = self.slots[seq]
        if slot.busy:
            return None
        keep, owners = self._reusable(prompt)
        if keep and seq in owners:
            kept = self._cut(slot, keep, reuse_from=slot)
        else:
            if slot.tokens:
                self._evict(slot)  # first: an eviction may reshuffle host RAM, so look again after it
                keep, owners = self._reusable(prompt)
            by_seq = {s.seq: s for s in self.slots}
            sources = sorted(owners, key=lambda o: (o not in by_seq, o))
            if not sources or keep < MIN_COPY:
                kept = self._cut(slot, 0, reuse_from=None)
            elif sources[0] in by_seq:
                kept = self._copy(by_seq[sources[0]], slot, keep)
            else:
                kept = self._restore(sources[0], slot, keep)
        slot.parted = None  # (a pinned request stops nowhere for it: acquire's)
        slot.busy = True
        slot.used_at = next(self._clock)
        return slot, kept

    def save_state(self, slot: Slot) -> Blob | None:
        """A copy of ``slot``'s KV state (llama.cpp's sequence state), or None when it cannot be copied."""
        return self._ops.save(slot.seq)

    def restore_state(self, slot: Slot, state: Blob) -> bool:
        """Replace ``slot``'s KV with ``state``, emptied first; its books say it holds nothing until
        :meth:`adopt` names its tokens. False when llama.cpp refuses the state (then it is empty)."""
        self.drop(slot)
        if self._ops.restore(slot.seq, state):
            return True
        self.drop(slot)
        return False

    def adopt(self, slot: Slot, tokens: Sequence[int]) -> None:
        """``slot``'s KV was replaced outside the cache (a slot file was restored into it): it holds
        exactly ``tokens`` now, and any request sharing their prefix may reuse them."""
        slot.tokens[:] = tokens
        slot.used_at = next(self._clock)
        if slot.tokens:
            self.index.set(slot.seq, slot.tokens)
        else:
            self.index.discard(slot.seq)

    def free_slots(self) -> int:
        return sum(not s.busy for s in self.slots)

    def stats(self) -> CacheStats:
        return CacheStats(
            **self._counts,
            saved=self.host.saved,
            **self.host.stats(),
            **(self.disk.stats() if self.disk is not None else {}),
            checkpoints=getattr(self._ops, "held", int)(),
            checkpoint_restores=getattr(self._ops, "restores", 0),
        )

    def observe_prefill(self, n_tokens: int, seconds: float) -> None:
        """A prefill chunk's time: the disk tier weighs a read against it."""
        if self.disk is not None:
            self.disk.observe_prefill(n_tokens, seconds)

    def warm(self) -> int:
        """At load, restore the disk tier's newest prefix into an empty slot: the first request
        after a restart, an unload or a swap that shares it then reuses a slot in place, with no
        read and no restore on its path. Of the entries written within :data:`WARM_BATCH_S` of
        the newest (what one slot left: its tail's state, its turn's), the longest. Its disk hit
        is counted when a request reuses it, with the tokens reused. Returns the tokens restored."""
        if self.disk is None or not self._reuse:
            return 0
        owner = self.disk.newest(WARM_BATCH_S)
        slot = next((s for s in self.slots if not s.tokens and not s.busy), None)
        n = len(self.disk.tokens(owner)) if owner is not None else 0
        if slot is None or owner is None or not n or not self.disk.worth(owner, n):
            return 0  # (not worth it: a request would prefill rather than read it, and the load would wait)
        started = time.perf_counter()
        keep = self._restore_disk(owner, slot, n, count=False)
        if keep:
            slot.warm_from, slot.used_at, slot.prompt_end = owner, next(self._clock), keep
            log.info("prompt cache: slot %d starts warm with a %d-token prefix from disk (%.3f s)",
                     slot.seq, keep, time.perf_counter() - started)  # fmt: skip
        return keep

    def persist(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Write every slot's prefix and every host entry the disk lacks, wait for the writes
        (at most ``timeout_s``) and close the tier: the model is unloading. Scheduler thread, or
        after it stopped."""
        if self.disk is None:
            return
        disk, self.disk = self.disk, None
        try:
            for slot in sorted(self.slots, key=lambda s: -s.used_at):  # the newest first, if the budget is short
                for tokens, blob in leaving_states(
                    self._ops, slot, skip=disk.holds, min_tokens=HOST_MIN_TOKENS, tail=self._min_tail
                ):
                    disk.spill(tokens, blob)
            for entry in sorted(self.host.entries.values(), key=lambda e: -e.used_at):
                disk.spill(entry.tokens, entry.blob)
        finally:
            disk.close(timeout_s)

    # --- placement ------------------------------------------------------------------------

    def _place(
        self, prompt: Sequence[int], keep: int, owners: frozenset[int], idle: list[Slot], spare: frozenset[int]
    ) -> tuple[Slot, int]:
        by_seq = {s.seq: s for s in self.slots}
        disk = self.disk if self.disk is not None else ()
        sources = sorted(owners, key=lambda o: (o not in by_seq or by_seq[o].busy, o not in by_seq, o in disk, o))
        source = sources[0] if keep > 0 and sources else None
        if source in disk and not (keep >= MIN_COPY and cast(DiskSpill, self.disk).worth(cast(int, source), keep)):
            source = None  # prefilling the prefix is cheaper than reading it
        if source is not None and source in by_seq and not by_seq[source].busy:
            slot = by_seq[source]
            empty = self._empty(idle, exclude=slot)
            if len(slot.tokens) - keep < KEEP_TAIL or empty is None or keep < MIN_COPY:
                return slot, self._warm_hit(slot, self._cut(slot, keep, reuse_from=slot))
            # Worth keeping the idle slot's longer conversation: copy the prefix out.
            return empty, self._warm_hit(slot, self._copy(slot, empty, keep))
        target = self._target(idle, spare)
        if source is None or keep < MIN_COPY:
            return target, self._cut(target, 0, reuse_from=None)
        if source in by_seq:
            return target, self._copy(by_seq[source], target, keep)
        if source in disk:
            return target, self._restore_disk(source, target, keep)
        return target, self._restore(source, target, keep)

    def _warm_hit(self, src: Slot, kept: int) -> int:
        """``kept`` tokens of ``src`` were reused: if :meth:`warm` restored them from disk, that
        is a disk hit of ``kept`` tokens (counted now, as any restore is counted by its reuse)."""
        owner, src.warm_from = src.warm_from, None
        if owner is not None and kept and self.disk is not None:
            self.disk.restored(owner, kept)
        return kept

    def _empty(self, idle: list[Slot], exclude: Slot | None = None) -> Slot | None:
        empty = [s for s in idle if not s.tokens and s is not exclude]
        return min(empty, key=lambda s: (self._gaps_with(s), s.seq)) if empty else None

    def _target(self, idle: list[Slot], spare: frozenset[int]) -> Slot:
        """The slot for a request that reuses nothing in place: the idle one that keeps the
        busy slots together (llama.cpp decodes consecutive busy sequences in one micro-batch
        and splits at every gap, a pass over the weights each: 20-30 % slower here), empty or
        least recently used on ties. If the content there is newer than another idle slot's,
        it moves over first (one copy), so what is lost is always the least recently used."""
        free = [s for s in idle if s.seq not in spare] or idle
        target = min(free, key=lambda s: (self._gaps_with(s), bool(s.tokens), s.used_at, s.seq))
        if target.tokens:
            older = [s for s in free if s is not target and (not s.tokens or s.used_at < target.used_at)]
            if older and len(target.tokens) >= MIN_COPY:
                self._relocate(target, min(older, key=lambda s: (bool(s.tokens), s.used_at)))
            else:
                self._evict(target)
        return target

    def _relocate(self, src: Slot, dst: Slot) -> None:
        """Move ``src``'s KV into ``dst`` (whose own content goes) and leave ``src`` empty."""
        if dst.tokens:
            self._evict(dst)
        self._ops.copy(src.seq, dst.seq)
        dst.tokens[:] = src.tokens
        dst.used_at = src.used_at
        dst.warm_from, src.warm_from = src.warm_from, None
        self.index.set(dst.seq, dst.tokens)
        self._ops.clear(src.seq)
        src.tokens.clear()
        self.index.discard(src.seq)
        self._counts["relocated"] += 1

    def _gaps_with(self, slot: Slot) -> int:
        """How many runs of consecutive busy sequences there would be with ``slot`` busy too."""
        busy = [s.busy or s is slot for s in self.slots]
        return sum(1 for i, b in enumerate(busy) if b and (i == 0 or not busy[i - 1]))

    def _cut(self, slot: Slot, keep: int, *, reuse_from: Slot | None) -> int:
        """Leave the first ``keep`` tokens in ``slot`` (0: clear it)."""
        reusable = keep > 0 and reuse_from is not None and self._ops.window_ok(slot.seq, keep)
        keep = self._shorten(slot.seq, keep) if reusable else 0
        if keep:
            del slot.tokens[keep:]
            self.index.set(slot.seq, slot.tokens)
            self._counts["reused_in_place"] += 1
            return keep
        if slot.tokens:
            self._ops.clear(slot.seq)
            slot.tokens.clear()
        self.index.discard(slot.seq)
        return 0

    def _copy(self, src: Slot, dst: Slot, keep: int) -> int:
        if not self._ops.window_ok(src.seq, keep):
            return self._cut(dst, 0, reuse_from=None)
        self._ops.copy(src.seq, dst.seq)
        dst.tokens[:] = src.tokens
        keep = self._shorten(dst.seq, keep)
        if not keep:
            return self._cut(dst, 0, reuse_from=None)
        del dst.tokens[keep:]
        self.index.set(dst.seq, dst.tokens)
        self._counts["copied"] += 1
        return keep

    def _shorten(self, seq: int, keep: int) -> int:
        """Cut ``seq`` to ``keep`` tokens; a memory that cannot be cut goes back to its newest
        checkpoint at or below ``keep`` instead (checkpoints.py). The tokens it holds (0: none)."""
        if self._ops.truncate(seq, keep):
            return keep
        rewind = getattr(self._ops, "rewind", None)
        return rewind(seq, keep) if rewind is not None else 0

    def _restore(self, owner: int, dst: Slot, keep: int) -> int:
        entry = self.host.entries.get(owner)
        if dst.tokens:
            self._ops.clear(dst.seq)
            dst.tokens.clear()
        if entry is None:  # the target's own eviction made room in host RAM by dropping it
            return self._cut(dst, 0, reuse_from=None)
        if not self._ops.restore(dst.seq, entry.blob):
            log.warning("restoring a saved prefix of %d tokens failed; prefilling instead", len(entry.tokens))
            self.host.drop(owner)
            return self._cut(dst, 0, reuse_from=None)
        entry.used_at = next(self._clock)
        dst.tokens[:] = entry.tokens
        if not (self._ops.window_ok(dst.seq, keep) and self._ops.truncate(dst.seq, keep)):
            return self._cut(dst, 0, reuse_from=None)
        del dst.tokens[keep:]
        self.index.set(dst.seq, dst.tokens)
        self._counts["restored"] += 1
        return keep

    def _restore_disk(self, owner: int, dst: Slot, keep: int, *, count: bool = True) -> int:
        disk = cast(DiskSpill, self.disk)  # a disk owner: the tier is open
        tokens = disk.tokens(owner)
        blob = disk.load(owner)  # None: gone or failed its check (the tier deleted it)
        if dst.tokens:
            self._ops.clear(dst.seq)
            dst.tokens.clear()
        if blob is None:
            return self._cut(dst, 0, reuse_from=None)
        if not self._ops.restore(dst.seq, blob):
            log.warning("llama.cpp refused a %d-token prefix from disk; deleted, prefilling instead", len(tokens))
            disk.refused(owner)
            self._ops.clear(dst.seq)
            return self._cut(dst, 0, reuse_from=None)
        dst.tokens[:] = tokens
        if not (self._ops.window_ok(dst.seq, keep) and self._ops.truncate(dst.seq, keep)):
            return self._cut(dst, 0, reuse_from=None)
        del dst.tokens[keep:]
        self.index.set(dst.seq, dst.tokens)
        if count:
            disk.restored(owner, keep)
        return keep

    # --- eviction and the host tier -----------------------------------------------------------

    def _evict(self, slot: Slot) -> None:
        if self.host.keeps(slot, self.disk):
            self.host.save(slot, self.disk)
        if self._buffers is not None:
            self._buffers.forget(slot.seq)
        slot.warm_from = None
        self._ops.clear(slot.seq)
        slot.tokens.clear()
        self.index.discard(slot.seq)
