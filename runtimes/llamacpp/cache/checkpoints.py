"""State checkpoints: prefix reuse for models whose memory cannot be cut back to any prefix.

A recurrent layer (Mamba, RWKV, LFM2's short convolutions, Qwen3.5's gated delta net) keeps one
state per sequence, the sum of everything read so far: ``llama_memory_seq_rm`` cannot take its
last tokens back out (it refuses any partial range). A sliding-window cache without ``swa_full``
has already overwritten the positions older than its window. For both the prefix cache
(:mod:`.prefix`) could reuse only a slot's *whole* content, so an agent turn whose prompt differs
from the slot anywhere after the system prompt prefilled the whole conversation again.

A checkpoint is the part of a sequence's state that cannot be cut (the recurrent state, or the
sliding-window cache), saved with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`` when the sequence held
exactly ``n_tokens`` tokens: small (the recurrent state does not grow with the context; LFM2's is
kilobytes). To reuse ``keep`` tokens of a slot, :meth:`CheckpointKv.rewind` restores the newest
checkpoint at or below ``keep`` and cuts the attention cache (which can be cut) back to its
``n_tokens``: the state is then what a cold prefill of those tokens leaves, and only the rest of
the prompt is prefilled. This is llama-server's scheme (``--ctx-checkpoints``, server-context.cpp).

Where checkpoints are taken (the scheduler asks :meth:`CheckpointKv.clip` where a prefill chunk
must end, and calls :meth:`CheckpointKv.taken_at` after each text chunk):

* at the end of every prompt's prefill: the next turn of a chat or an agent shares exactly this
  (its prompt is this prompt, the answer as the client renders it, and the new turn). The slot's
  own end (prompt + sampled answer) is shared only when the client's rendering of the answer gives
  back the sampled tokens, which reasoning models (thinking stripped), tool calls (re-serialised)
  and plain BPE re-tokenization often do not;
* ``TAIL`` tokens before the end of the prompt (``min_chunk`` where that is more): a request
  repeated as it was (a retry, a regenerate, a client resending) shares all of its prompt but the
  tokens the prefix cache always evaluates again, so the end checkpoint lies just past what it
  may reuse;
* every ``interval`` tokens of a long prefill: an edit or a compaction in the middle of a long
  conversation re-prefills from the last checkpoint below it, not from the start;
* where the prompt's last user message (a raw prompt: its last part) begins (turns.py), and where
  it parted from the longest cached content it shared (``Slot.parted``, set by the prefix cache):
  two requests that share a document and part after it say the next one will part there too, and
  a state that cannot be cut exists at a position only if the prefill stopped there. The slot
  leaves a state at these points when it is cleared (leaving.py), so a raw prompt whose tail
  changes comes back after a restart to where it parted, not to the 2,048-token mark below.

At most ``limit`` per sequence (setting ``cache.checkpoints``). When one more is taken, the one
dropped is the one whose loss costs least: with a divergence point equally likely anywhere,
removing a checkpoint between gaps ``g1`` and ``g2`` adds ``g1 * g2`` to the expected tokens
prefilled again, so the smallest product goes (the tail checkpoint beside an end one first,
then the closer of two interval ones); the newest end checkpoint is never dropped.

Checkpoints belong to a sequence's content: this class wraps the context's :class:`~.slot.KvOps`
and keeps them in step with every operation (a cut drops those past it, a copy copies them, a clear
or a whole-state restore drops them), so the prefix cache's bookkeeping needs no second copy.
What leaves a slot for host RAM (and disk) is a full state of exactly the slot's tokens, which
restores without a cut: the prefix cache reuses such an entry only when the prompt covers it whole
(:attr:`CheckpointKv.cuttable` is False); which states leave, and at which points, is
:mod:`.leaving`'s. Plain attention models get none of this: no wrapper, no cost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from localrun.runtimes.llamacpp.cache.kv_file import Blob
from localrun.runtimes.llamacpp.cache.slots import Layout, LlamaKvOps, read_state, state_source
from localrun.runtimes.llamacpp.cache.state_memory import ReadyBuffers, default_max_bytes
from localrun.runtimes.llamacpp.turns import turn_of

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.slot import KvOps, Slot

log = logging.getLogger(__name__)

#: Tokens before a prompt's end where a second checkpoint is taken (llama-server: 4).
TAIL = 4
#: Tokens between checkpoints inside one long prefill: about 5-10 s of prefill on two CPU cores.
DEFAULT_INTERVAL = 2048
#: Checkpoints per sequence when the plan does not say (settings ``cache.checkpoints``).
DEFAULT_LIMIT = 8

_Ops = TypeVar("_Ops", bound="KvOps")


class SeqState(Protocol):
    """Save and restore one sequence's state (:class:`PartialState`: the part that cannot be cut)."""

    def save(self, seq: int) -> Blob | None: ...

    def restore(self, seq: int, blob: Blob) -> bool: ...


def memory_kind(llama: Any, model: Any, *, swa_full: bool) -> str | None:
    """The kind of memory, "recurrent", "hybrid" or "swa", for a model that cannot cut it back to any prefix
    (sliding window only without a full-size cache), None for one that can."""
    if llama.llama_model_is_recurrent(model):
        return "recurrent"
    if llama.llama_model_is_hybrid(model):
        return "hybrid"
    if llama.llama_model_n_swa(model) > 0 and not swa_full:
        return "swa"
    return None


@dataclass(frozen=True)
class Checkpoint:
    n_tokens: int  # the sequence held exactly this many tokens when the state was saved
    blob: Blob
    end: bool = False  # taken at the end of a prompt's prefill


def _drop_order(points: list[Checkpoint], length: int) -> int | None:
    """Index of the checkpoint whose removal adds the least expected re-prefill (``g1 * g2``),
    never the newest end checkpoint; None when nothing may go."""
    newest_end = max((i for i, c in enumerate(points) if c.end), default=None, key=lambda i: points[i].n_tokens)
    best, best_cost = None, None
    for i, c in enumerate(points):
        if i == newest_end:
            continue
        before = points[i - 1].n_tokens if i > 0 else 0
        after = points[i + 1].n_tokens if i + 1 < len(points) else max(length, c.n_tokens)
        cost = (c.n_tokens - before) * (after - c.n_tokens)
        if best_cost is None or cost < best_cost:
            best, best_cost = i, cost
    return best


class CheckpointKv:
    """:class:`~.slot.KvOps` for a model that cannot cut its memory, with checkpoints per sequence."""

    #: Read by the prefix cache: a saved state restores only at its own length.
    cuttable = False

    def __init__(
        self,
        ops: KvOps,
        partial: SeqState,
        *,
        limit: int = DEFAULT_LIMIT,
        interval: int = DEFAULT_INTERVAL,
        tail: int = TAIL,
    ) -> None:
        self._ops = ops  # the context's KvOps (clear, truncate, copy, window_ok, save, restore)
        self._partial = partial  # save(seq) -> bytes | None and restore(seq, blob) -> bool, partial state
        self.limit = max(0, int(limit))
        self.interval = max(1, int(interval))
        self.tail = max(1, int(tail))  # at least the prefix cache's min_tail, which a repeat re-evaluates
        self._points: dict[int, list[Checkpoint]] = {}  # seq -> checkpoints, by n_tokens
        self.taken = 0
        self.restores = 0

    # --- the KvOps protocol, keeping the checkpoints in step ------------------------------------

    def clear(self, seq: int) -> None:
        self._ops.clear(seq)
        self._points.pop(seq, None)

    def truncate(self, seq: int, keep: int) -> bool:
        """Cut to ``keep`` tokens where the memory allows it (at the sequence's end, or a window
        still whole); False leaves the sequence as it was, and :meth:`rewind` is the way back."""
        if not self._ops.window_ok(seq, keep) or not self._ops.truncate(seq, keep):
            return False
        self._forget_after(seq, keep)
        return True

    def copy(self, src: int, dst: int) -> None:
        self._ops.copy(src, dst)
        self._points[dst] = list(self._points.get(src, ()))

    def window_ok(self, seq: int, keep: int) -> bool:
        return True  # truncate checks the window, and a checkpoint brings one back

    def save(self, seq: int) -> Blob | None:
        return self._ops.save(seq)

    def restore(self, seq: int, blob: Blob) -> bool:
        self._points.pop(seq, None)
        return self._ops.restore(seq, blob)

    # --- checkpoints ------------------------------------------------------------------------

    def rewind(self, seq: int, keep: int) -> int:
        """Bring ``seq`` back to the newest checkpoint at or below ``keep`` tokens; the tokens it
        holds now (0: none usable, the caller clears the sequence)."""
        for point in sorted(self._points.get(seq, ()), key=lambda c: -c.n_tokens):
            if point.n_tokens > keep or point.n_tokens <= 0:
                continue
            if (
                self._partial.restore(seq, point.blob)
                and self._ops.truncate(seq, point.n_tokens)
                and self._ops.window_ok(seq, point.n_tokens)
            ):
                self._forget_after(seq, point.n_tokens)
                self.restores += 1
                return point.n_tokens
            log.warning("restoring the checkpoint at %d tokens of sequence %d failed", point.n_tokens, seq)
            self._points[seq] = [c for c in self._points.get(seq, ()) if c is not point]
        return 0

    def clip(
        self, start: int, n: int, total: int, min_chunk: int = 1, turn: int | None = None, parted: int | None = None
    ) -> int:
        """The length of the prefill chunk from ``start`` (``n`` planned, ``total`` the prompt's
        length) so that it ends at the next position where a checkpoint is due (``turn``: where
        the prompt's last user message begins, turns.py; ``parted``: where it parted from the
        cached content it shared most, ``Slot.parted``)."""
        if self.limit <= 0:
            return n
        end = start + n
        stops = [total - self.tail, (start // self.interval + 1) * self.interval, *(m for m in (turn, parted) if m)]
        for stop in sorted(stops):
            if start + min_chunk <= stop < end and total - stop >= min_chunk:
                return stop - start
        return n

    def taken_at(self, seq: int, n_tokens: int, total: int, turn: int | None = None, parted: int | None = None) -> None:
        """A text prefill chunk landed: ``seq`` holds ``n_tokens`` of a ``total``-token prompt.
        Take a checkpoint if this is one of the chosen positions (:meth:`clip`'s)."""
        if self.limit <= 0 or n_tokens <= 0:
            return
        end = n_tokens == total
        if not (end or n_tokens in (total - self.tail, turn, parted) or n_tokens % self.interval == 0):
            return
        blob = self._partial.save(seq)
        if not blob:
            return
        points = [c for c in self._points.get(seq, ()) if c.n_tokens != n_tokens]
        points.append(Checkpoint(n_tokens, blob, end))
        points.sort(key=lambda c: c.n_tokens)
        while len(points) > self.limit:
            drop = _drop_order(points, n_tokens)
            if drop is None:
                break
            del points[drop]
        self._points[seq] = points
        self.taken += 1

    def held(self) -> int:
        return sum(len(points) for points in self._points.values())

    def held_bytes(self) -> int:
        return sum(len(c.blob) for points in self._points.values() for c in points)

    def positions(self, seq: int) -> list[int]:
        return [c.n_tokens for c in self._points.get(seq, ())]

    def _forget_after(self, seq: int, keep: int) -> None:
        points = self._points.get(seq)
        if points:
            self._points[seq] = [c for c in points if c.n_tokens <= keep]


def marks(prompt: Sequence[int], slot: Slot | None) -> tuple[int | None, int | None]:
    """The chosen positions of ``prompt``'s prefill into ``slot`` besides its tail and the interval
    marks, as :meth:`CheckpointKv.clip` and :meth:`CheckpointKv.taken_at` take them: where its last
    user message begins (turns.py) and where it parted from the cached content it shared most."""
    return turn_of(prompt), (slot.parted if slot is not None else None)


class PartialState:
    """The per-sequence state API with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: only the memory
    that cannot be cut (the recurrent state; the sliding-window cache), not the attention KV."""

    def __init__(self, llama: Any, ctx: Any) -> None:
        self._llama, self._ctx = llama, ctx
        self._flags = llama.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY

    def save(self, seq: int) -> Blob | None:
        size: int = self._llama.llama_state_seq_get_size_ext(self._ctx, seq, self._flags)
        get = self._llama.llama_state_seq_get_data_ext
        return read_state(size, lambda dst, n: get(self._ctx, dst, n, seq, self._flags))

    def restore(self, seq: int, blob: Blob) -> bool:
        src = state_source(blob)
        return bool(self._llama.llama_state_seq_set_data_ext(self._ctx, src, len(blob), seq, self._flags))


def with_checkpoints(
    ops: _Ops, llama: Any, ctx: Any, kind: str | None, *, limit: int, min_chunk: int = 1
) -> _Ops | CheckpointKv:
    """The KvOps the prefix cache gets: ``ops`` itself for a model that can cut its memory,
    checkpoints around it for one that cannot."""
    if kind is None:
        return ops
    log.info("%s memory: prefix reuse through up to %d state checkpoints per sequence", kind, limit)
    return CheckpointKv(ops, PartialState(llama, ctx), limit=limit, tail=max(TAIL, min_chunk))


def context_kv(
    llama: Any, ctx: Any, layout: Layout, *, n_swa: int, memory: str | None, saves: bool
) -> tuple[LlamaKvOps | CheckpointKv, ReadyBuffers | None]:
    """The KV operations a scheduler's prefix cache runs on, and the memory made ready for what an
    idle slot would leave with (state_memory.py; only when evictions save: host RAM or ``saves``, a
    disk tier). With prefix reuse, checkpoints wrap them where ``memory`` cannot be cut back."""
    buffers = None
    if layout.prefix_cache and (layout.host_cache_bytes or saves):
        buffers = ReadyBuffers(default_max_bytes(), lambda seq: llama.llama_state_seq_get_size(ctx, seq))
    kv = LlamaKvOps(llama, ctx, n_swa=n_swa, buffers=buffers)
    if not layout.prefix_cache:
        return kv, buffers
    return with_checkpoints(kv, llama, ctx, memory, limit=layout.checkpoints, min_chunk=layout.min_chunk), buffers
