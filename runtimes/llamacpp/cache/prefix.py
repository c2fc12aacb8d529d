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
from dataclasses import dataclass, field
from typing import Protocol

from localrun.runtimes.llamacpp.cache.checkpoints import leaving_count, leaving_states, saved_cuttable
from localrun.runtimes.llamacpp.cache.kv_file import Blob
from localrun.runtimes.llamacpp.cache.prefix_disk import FLUSH_TIMEOUT_S, DiskSpill
from localrun.runtimes.llamacpp.cache.radix import RadixIndex
from localrun.runtimes.llamacpp.media.prompt import media_safe_cut

log = logging.getLogger(__name__)

#: A copy or a host restore costs a memcpy of the whole slot; below this, prefilling is as cheap.
MIN_COPY = 32
#: Shorter shared prefixes are not reused at all: they save a few milliseconds of prefill but
#: pin the request to a slot that may split the decode batch (see ``_victim``).
MIN_REUSE = 16
#: Sequences shorter than this are not worth a host-RAM entry.
HOST_MIN_TOKENS = 64
#: An idle slot whose content goes this far past the shared prefix is copied from, not cut.
KEEP_TAIL = 64
#: Disk entries written this close to the newest one count as one slot's leaving (:meth:`PrefixCache.warm`).
WARM_BATCH_S = 5.0


class KvOps(Protocol):
    """The KV operations the cache asks of the context (llama.cpp's memory and state API)."""

    def clear(self, seq: int) -> None: ...

    def truncate(self, seq: int, keep: int) -> bool: ...

    def copy(self, src: int, dst: int) -> None: ...

    def window_ok(self, seq: int, keep: int) -> bool: ...

    def save(self, seq: int) -> Blob | None: ...

    def restore(self, seq: int, blob: Blob) -> bool: ...


@dataclass
class Slot:
    """One sequence of the context. ``tokens`` lists exactly the tokens whose KV it holds."""

    seq: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    used_at: int = 0
    prompt_end: int = 0  # how many of ``tokens`` the last prompt's prefill left (the answer follows)
    #: Where that prompt's last user message begins (turns.TurnPrompt.turn), if it says.
    turn: Callable[[], int | None] | None = None
    #: The disk owner :meth:`PrefixCache.warm` restored this content from, until a request reuses it.
    warm_from: int | None = None


@dataclass
class _HostEntry:
    tokens: list[int]
    blob: bytes
    used_at: int


@dataclass(frozen=True)
class CacheStats:
    reused_in_place: int = 0
    copied: int = 0
    restored: int = 0
    saved: int = 0
    relocated: int = 0
    host_bytes: int = 0
    host_entries: int = 0
    host_tokens: int = 0
    # The disk tier (kv_disk.py): what it holds for this model's key, and its counters.
    disk_entries: int = 0
    disk_bytes: int = 0
    disk_tokens: int = 0
    disk_hits: int = 0  # prefixes restored from disk
    disk_misses: int = 0  # lookups that found nothing usable there (or a file that failed its check)
    disk_read_bytes: int = 0
    disk_written_bytes: int = 0
    disk_restored_tokens: int = 0
    # State checkpoints (hybrid, recurrent and sliding-window models: checkpoints.py).
    checkpoints: int = 0
    checkpoint_restores: int = 0


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
        disk=None,
        buffers=None,
    ) -> None:
        self.slots = [Slot(seq) for seq in range(n_slots)]
        self._ops = ops
        self._min_tail = max(1, min_tail)
        self._reuse = reuse
        self._host_budget = max(0, int(host_budget))
        self._host: dict[int, _HostEntry] = {}
        self._host_ids = itertools.count(n_slots)  # owner ids: slots are 0..n-1, host entries after
        self._clock = itertools.count(1)
        self.index = RadixIndex()
        self._counts = {"reused_in_place": 0, "copied": 0, "restored": 0, "saved": 0, "relocated": 0}
        whole_only = not saved_cuttable(ops)
        self.disk = DiskSpill(disk, self.index, self._host_ids, whole_only=whole_only) if disk is not None else None
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
        slot, keep = self._place(prompt, keep, owners, idle, spare)
        if self.disk is not None and keep == 0 and len(prompt) >= HOST_MIN_TOKENS:
            self.disk.missed()
        slot.warm_from = None  # its content is this request's now
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
        keep = media_safe_cut(prompt, min(found, limit))  # never inside an image's chunk (media_prompt.py)
        if not saved_cuttable(self._ops):  # a saved state restores only whole (checkpoints.py)
            keep, owners = self._uncut_reuse(prompt, keep, owners, limit)
        if keep < max(MIN_REUSE, self._min_tail) or not owners:  # a few tokens are not worth it
            return 0, frozenset()
        return keep, owners

    def _uncut_reuse(
        self, prompt: Sequence[int], keep: int, owners: frozenset[int], limit: int
    ) -> tuple[int, frozenset[int]]:
        """Saved states that restore only whole: one serves only if the prompt covers it whole; a
        slot as far as it cuts (memory that cannot be cut: its newest checkpoint at or below
        ``keep``, or whole). The longer of the slots' reach and the longest saved state covered."""
        by_seq = {s.seq: s for s in self.slots}
        slots = frozenset(o for o in owners if o in by_seq)
        exact = frozenset(o for o in owners if o not in by_seq and self._saved_length(o) == keep)
        if exact:
            return keep, exact | slots
        if not slots:
            reach = 0
        elif getattr(self._ops, "cuttable", True):  # a full-size window cache: cut unless restored from a state
            reach = keep if any(self._ops.window_ok(o, keep) for o in slots) else 0
        else:
            positions = self._ops.positions
            reach = max(
                keep if len(by_seq[o].tokens) == keep else max((p for p in positions(o) if p <= keep), default=0)
                for o in slots
            )
        whole, enders = self.index.whole(prompt, limit)
        if whole > reach and media_safe_cut(prompt, whole) == whole:
            return whole, enders
        return (keep, slots) if slots else (0, frozenset())

    def _saved_length(self, owner: int) -> int | None:
        """How many tokens a saved state (host RAM or disk) holds; None for a slot."""
        if owner in self._host:
            return len(self._host[owner].tokens)
        if self.disk is not None and owner in self.disk:
            return len(self.disk.tokens(owner))
        return None

    def extended(self, slot: Slot, turn: Callable[[], int | None] | None = None) -> None:
        """``slot.tokens`` grew (a prefill chunk landed): others may now reuse it. ``turn``: where
        its prompt's last user message begins (a state worth leaving there, checkpoints.py)."""
        slot.prompt_end = len(slot.tokens)
        slot.turn = turn
        self.index.set(slot.seq, slot.tokens)

    def release(self, slot: Slot) -> None:
        """The request in ``slot`` ended; its KV stays for whoever shares its prefix next."""
        slot.busy = False
        slot.used_at = next(self._clock)
        self.index.set(slot.seq, slot.tokens)
        if self._buffers is not None:
            self._buffers.want(slot.seq, self._leaving_count(slot) if self._keeps(slot) else 0)

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

    def free_slots(self) -> int:
        return sum(not s.busy for s in self.slots)

    def stats(self) -> CacheStats:
        return CacheStats(
            **self._counts,
            host_bytes=self.host_bytes,
            host_entries=len(self._host),
            host_tokens=sum(len(e.tokens) for e in self._host.values()),
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
        if slot is None or not n or not self.disk.worth(owner, n):
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
            for entry in sorted(self._host.values(), key=lambda e: -e.used_at):
                disk.spill(entry.tokens, entry.blob)
        finally:
            disk.close(timeout_s)

    @property
    def host_bytes(self) -> int:
        return sum(len(e.blob) for e in self._host.values())

    # --- placement ------------------------------------------------------------------------

    def _place(
        self, prompt: Sequence[int], keep: int, owners: frozenset[int], idle: list[Slot], spare: frozenset[int]
    ) -> tuple[Slot, int]:
        by_seq = {s.seq: s for s in self.slots}
        disk = self.disk if self.disk is not None else ()
        sources = sorted(owners, key=lambda o: (o not in by_seq or by_seq[o].busy, o not in by_seq, o in disk, o))
        source = sources[0] if keep > 0 and sources else None
        if source in disk and not (keep >= MIN_COPY and self.disk.worth(source, keep)):
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
        entry = self._host.get(owner)
        if dst.tokens:
            self._ops.clear(dst.seq)
            dst.tokens.clear()
        if entry is None:  # the target's own eviction made room in host RAM by dropping it
            return self._cut(dst, 0, reuse_from=None)
        if not self._ops.restore(dst.seq, entry.blob):
            log.warning("restoring a saved prefix of %d tokens failed; prefilling instead", len(entry.tokens))
            self._drop_host(owner)
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
        tokens = self.disk.tokens(owner)
        blob = self.disk.load(owner)  # None: gone or failed its check (the tier deleted it)
        if dst.tokens:
            self._ops.clear(dst.seq)
            dst.tokens.clear()
        if blob is None:
            return self._cut(dst, 0, reuse_from=None)
        if not self._ops.restore(dst.seq, blob):
            log.warning("llama.cpp refused a %d-token prefix from disk; deleted, prefilling instead", len(tokens))
            self.disk.refused(owner)
            self._ops.clear(dst.seq)
            return self._cut(dst, 0, reuse_from=None)
        dst.tokens[:] = tokens
        if not (self._ops.window_ok(dst.seq, keep) and self._ops.truncate(dst.seq, keep)):
            return self._cut(dst, 0, reuse_from=None)
        del dst.tokens[keep:]
        self.index.set(dst.seq, dst.tokens)
        if count:
            self.disk.restored(owner, keep)
        return keep

    # --- eviction and the host tier -----------------------------------------------------------

    def _keeps(self, slot: Slot) -> bool:
        """Whether evicting ``slot`` saves its content (to host RAM or disk)."""
        return len(slot.tokens) >= HOST_MIN_TOKENS and bool(self._host_budget or self.disk is not None)

    def _evict(self, slot: Slot) -> None:
        if self._keeps(slot):
            self._keep_evicted(slot)
        if self._buffers is not None:
            self._buffers.forget(slot.seq)
        slot.warm_from = None
        self._ops.clear(slot.seq)
        slot.tokens.clear()
        self.index.discard(slot.seq)

    def _held(self, slot: Slot) -> Callable[[list[int]], bool]:
        """Whether a state of ``slot``'s leaving would be held already (:func:`leaving_states`' ``skip``)."""
        disk = self.disk if self.disk is not None else ()
        cuttable = saved_cuttable(self._ops)

        def held(tokens: list[int]) -> bool:
            if self.disk is not None and self.disk.holds(tokens):
                return True  # a slot restored from disk and left as it was: no copy to host RAM either
            if cuttable:  # any longer entry serves this prefix too
                return self._held_elsewhere(slot.seq, tokens, ignore=disk)
            return any(e.tokens == tokens for e in self._host.values())  # only the same tokens do

        return held

    def _leaving_count(self, slot: Slot) -> int:
        return leaving_count(self._ops, slot, skip=self._held(slot), min_tokens=HOST_MIN_TOKENS, tail=self._min_tail)

    def _keep_evicted(self, slot: Slot) -> None:
        """Save a slot's content before it is cleared (with its checkpoints' states where its
        memory cannot be cut, :func:`~.checkpoints.leaving_states`): to host RAM, else (too big,
        RAM off) to disk."""
        started = time.perf_counter()
        states = leaving_states(self._ops, slot, skip=self._held(slot), min_tokens=HOST_MIN_TOKENS, tail=self._min_tail)
        log.info(
            "prompt cache: slot %d leaves %d states (%s tokens, %.1f MB) in %.3f s",
            slot.seq,
            len(states),
            "/".join(str(len(t)) for t, _ in states),
            sum(len(b) for _, b in states) / 1e6,
            time.perf_counter() - started,
        )
        for tokens, blob in states:
            if len(blob) <= self._host_budget:
                self._make_host_room(len(blob))
                owner = next(self._host_ids)
                self._host[owner] = _HostEntry(tokens, blob, next(self._clock))
                self.index.set(owner, tokens)
                self._counts["saved"] += 1
            elif self.disk is not None:
                self.disk.spill(tokens, blob)

    def _held_elsewhere(self, seq: int, tokens: Sequence[int], ignore=()) -> bool:
        """Another slot or host entry than ``seq`` holds all of ``tokens`` (owners in ``ignore`` do not count)."""
        found, owners = self.index.longest(tokens)
        return found == len(tokens) and any(o != seq and o not in ignore for o in owners)

    def _make_host_room(self, need: int) -> None:
        while self._host and self.host_bytes + need > self._host_budget:
            owner = min(self._host, key=lambda o: self._host[o].used_at)
            if self.disk is not None:  # host RAM's least recently used goes down a tier
                self.disk.spill(self._host[owner].tokens, self._host[owner].blob)
            self._drop_host(owner)

    def _drop_host(self, owner: int) -> None:
        self._host.pop(owner, None)
        self.index.discard(owner)
