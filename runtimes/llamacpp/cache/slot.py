"""One slot of a llama.cpp context as the prefix cache keeps its books, the KV operations the
cache asks of the context (:class:`KvOps`, so the policy is tested without llama.cpp), and the
cache's counters (:class:`CacheStats`, what ``ps``, ``/metrics`` and the slot API show)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from localrun.runtimes.llamacpp.cache.kv_file import Blob


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
    #: Where that prompt parted from the longest cached content it shared (another request's), if it
    #: did inside its prompt: a state worth leaving there too (the next prompt shares it as well).
    parted: int | None = None
    #: The disk owner :meth:`PrefixCache.warm` restored this content from, until a request reuses it.
    warm_from: int | None = None


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
