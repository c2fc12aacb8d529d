"""Host RAM under a llama.cpp context's slots: what an evicted slot leaves behind.

Evicting a slot saves its content first when it is worth it (:data:`HOST_MIN_TOKENS` or more,
and host RAM or a disk tier configured): the states :func:`~.leaving.leaving_states` picks
(the slot's tokens, and its checkpoints' states where the memory cannot be cut), each to host RAM
when it fits the budget, else to disk. Host RAM's least recently used entries go down to disk
to make room. Entries are owners in the prefix cache's radix index, numbered after the slots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localrun.runtimes.llamacpp.cache.kv_file import Blob
from localrun.runtimes.llamacpp.cache.leaving import leaving_count, leaving_states, saved_cuttable
from localrun.runtimes.llamacpp.cache.radix import RadixIndex
from localrun.runtimes.llamacpp.cache.slot import KvOps, Slot

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.prefix_disk import DiskSpill

log = logging.getLogger(__name__)

#: Sequences shorter than this are not worth a host-RAM entry.
HOST_MIN_TOKENS = 64


@dataclass
class HostEntry:
    tokens: list[int]
    blob: Blob
    used_at: int


class HostTier:
    """Saved states in host RAM, at most ``budget`` bytes (0: none; evictions then go to disk only).

    ``disk`` is passed to each call (the cache's tier, or None once it is closed)."""

    def __init__(
        self,
        ops: KvOps,
        index: RadixIndex,
        *,
        budget: int,
        owner_ids: Iterator[int],
        clock: Iterator[int],
        min_tail: int,
    ) -> None:
        self._ops, self._index = ops, index
        self.budget = max(0, int(budget))
        self.entries: dict[int, HostEntry] = {}
        self._ids, self._clock, self._min_tail = owner_ids, clock, min_tail
        self.saved = 0  # entries ever saved here

    @property
    def bytes(self) -> int:
        return sum(len(e.blob) for e in self.entries.values())

    def stats(self) -> dict[str, int]:
        return {
            "host_bytes": self.bytes,
            "host_entries": len(self.entries),
            "host_tokens": sum(len(e.tokens) for e in self.entries.values()),
        }

    def keeps(self, slot: Slot, disk: DiskSpill | None) -> bool:
        """Whether evicting ``slot`` saves its content (to host RAM or disk)."""
        return len(slot.tokens) >= HOST_MIN_TOKENS and bool(self.budget or disk is not None)

    def leaving_count(self, slot: Slot, disk: DiskSpill | None) -> int:
        """How many states evicting ``slot`` would save now (what memory to make ready for)."""
        skip = self._held(slot, disk)
        return leaving_count(self._ops, slot, skip=skip, min_tokens=HOST_MIN_TOKENS, tail=self._min_tail)

    def save(self, slot: Slot, disk: DiskSpill | None) -> None:
        """Save a slot's content before it is cleared (with its checkpoints' states where its
        memory cannot be cut, :func:`~.leaving.leaving_states`): to host RAM, else (too big,
        RAM off) to disk."""
        started = time.perf_counter()
        skip = self._held(slot, disk)
        states = leaving_states(self._ops, slot, skip=skip, min_tokens=HOST_MIN_TOKENS, tail=self._min_tail)
        log.info(
            "prompt cache: slot %d leaves %d states (%s tokens, %.1f MB) in %.3f s",
            slot.seq,
            len(states),
            "/".join(str(len(t)) for t, _ in states),
            sum(len(b) for _, b in states) / 1e6,
            time.perf_counter() - started,
        )
        for tokens, blob in states:
            if len(blob) <= self.budget:
                self._make_room(len(blob), disk)
                owner = next(self._ids)
                self.entries[owner] = HostEntry(tokens, blob, next(self._clock))
                self._index.set(owner, tokens)
                self.saved += 1
            elif disk is not None:
                disk.spill(tokens, blob)

    def drop(self, owner: int) -> None:
        self.entries.pop(owner, None)
        self._index.discard(owner)

    def _held(self, slot: Slot, disk: DiskSpill | None) -> Callable[[list[int]], bool]:
        """Whether a state of ``slot``'s leaving would be held already (:func:`leaving_states`' ``skip``)."""
        ignore: DiskSpill | frozenset[int] = disk if disk is not None else frozenset()
        cuttable = saved_cuttable(self._ops)

        def held(tokens: list[int]) -> bool:
            if disk is not None and disk.holds(tokens):
                return True  # a slot restored from disk and left as it was: no copy to host RAM either
            if cuttable:  # any longer entry serves this prefix too
                return self._held_elsewhere(slot.seq, tokens, ignore=ignore)
            return any(e.tokens == tokens for e in self.entries.values())  # only the same tokens do

        return held

    def _held_elsewhere(
        self, seq: int, tokens: Sequence[int], ignore: DiskSpill | frozenset[int] = frozenset()
    ) -> bool:
        """Another slot or host entry than ``seq`` holds all of ``tokens`` (owners in ``ignore`` do not count)."""
        found, owners = self._index.longest(tokens)
        return found == len(tokens) and any(o != seq and o not in ignore for o in owners)

    def _make_room(self, need: int, disk: DiskSpill | None) -> None:
        while self.entries and self.bytes + need > self.budget:
            owner = min(self.entries, key=lambda o: self.entries[o].used_at)
            if disk is not None:  # host RAM's least recently used goes down a tier
                disk.spill(self.entries[owner].tokens, self.entries[owner].blob)
            self.drop(owner)
