"""What a slot leaves behind when it is cleared, where a saved state restores only whole.

A model whose memory cannot be cut (recurrent layers) or whose saved state keeps only its
sliding window restores a saved state whole or not at all, so the prefix cache (:mod:`.prefix`)
and its host tier (:mod:`.host_tier`) ask this module which states a leaving slot saves (its
whole content, and the slot taken back to chosen points below its end: its checkpoints, or cuts)
and what of a prompt such whole-only states and slots can serve (:func:`uncut_reuse`). Plain
attention models save their whole content once and reuse any prefix of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from localrun.runtimes.llamacpp.cache.checkpoints import DEFAULT_INTERVAL, TAIL, CheckpointKv
from localrun.runtimes.llamacpp.cache.kv_file import Blob
from localrun.runtimes.llamacpp.media.prompt import media_safe_cut

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.radix import RadixIndex
    from localrun.runtimes.llamacpp.cache.slot import KvOps, Slot

#: States at checkpoints below its end that a leaving slot also leaves (host RAM, disk), and the
#: fewest tokens between two of them (see :func:`leaving_states`). Points chosen for what they are
#: (the tail, the last user message, where the prompt parted from another) may be one more.
LEAVING_POINTS = 2
LEAVING_GAP = 256
#: A slot whose answer is at most this many tokens past its first leaving point does not also
#: leave its whole content: the point serves the next turn, which prefills those few tokens again
#: (a 16k-token Gemma state is 57 MB that eviction copies on the scheduler thread).
SHORT_ANSWER = 4 * TAIL


def leaving_points(positions: Sequence[int], length: int, *, min_tokens: int, first: Sequence[int] = ()) -> list[int]:
    """Which checkpoints (token counts, newest first) a slot of ``length`` tokens leaves states at:
    at most :data:`LEAVING_POINTS`, :data:`LEAVING_GAP` apart, below ``length``. Of two within a
    few tokens of each other (a prompt's end and its tail) the older: it serves a repeat of the
    request as well as the next turn, which prefills those few tokens again. ``first``: points
    chosen for what they are (the prompt's tail, where its last user message or last part begins,
    where it parted from another), taken before any of ``positions``; of two of them only a few
    tokens apart, the older too: a short last message or question after a shared document is
    then served when it changes, for a few more tokens of prefill when it does not."""
    chosen: list[int] = []
    taken: list[int] = []
    for group, gap in ((first, 4 * TAIL + 1), (positions, LEAVING_GAP)):
        for n in sorted(set(group), reverse=True):
            if n >= length or n < min_tokens:
                continue
            i = next((i for i, t in enumerate(taken) if abs(t - n) < gap), None)
            if i is not None:
                if taken[i] not in chosen and taken[i] - n <= 4 * TAIL:
                    taken[i] = n
                continue
            if len(taken) >= LEAVING_POINTS + (group is first):
                break
            taken.append(n)
        chosen = list(taken)
    return sorted(taken, reverse=True)


def saved_cuttable(ops: KvOps) -> bool:
    """Whether a state ``ops`` saved restores at any prefix (else only whole): not for memory that
    cannot be cut, nor for a sliding-window model's, whose saved state keeps only the window."""
    return bool(getattr(ops, "saved_cuttable", True)) and bool(getattr(ops, "cuttable", True))


def uncut_reuse(
    prompt: Sequence[int],
    keep: int,
    owners: frozenset[int],
    limit: int,
    ops: KvOps,
    index: RadixIndex,
    slots: dict[int, Slot],
    saved_length: Callable[[int], int | None],
) -> tuple[int, frozenset[int]]:
    """What the prefix cache may reuse of ``prompt`` when saved states restore only whole: one
    serves only if the prompt covers it whole; a slot (of ``slots``, by sequence) as far as it cuts
    (memory that cannot be cut: its newest checkpoint at or below ``keep``, or whole). The longer of
    the slots' reach and the longest saved state covered, and its owners in ``index``."""
    held = frozenset(o for o in owners if o in slots)
    exact = frozenset(o for o in owners if o not in slots and saved_length(o) == keep)

    def reach(o: int) -> int:  # how far slot ``o`` goes back towards ``keep``
        if len(slots[o].tokens) == keep:
            return keep
        if getattr(ops, "cuttable", True):  # a full-size window cache: cut unless restored from a state
            return keep if ops.window_ok(o, keep) else 0
        return max((p for p in cast(CheckpointKv, ops).positions(o) if p <= keep), default=0)  # checkpoints

    reaches = {o: reach(o) for o in held}
    if exact:  # with the slots that get there too (a slot restored whole, say at load, may not)
        return keep, exact | frozenset(o for o, n in reaches.items() if n == keep)
    reached = max(reaches.values(), default=0)
    whole, enders = index.whole(prompt, limit)
    if whole > reached and media_safe_cut(prompt, whole) == whole:
        return whole, enders
    return (keep, held) if held else (0, frozenset())


@dataclass(frozen=True)
class _Leaving:
    """What a leaving slot leaves (:func:`leaving_states`), worked out without touching it."""

    whole: bool  # its whole content
    points: list[int]  # and states at these token counts, newest first
    back: Callable[[int], int] | None  # (n) -> the tokens the sequence holds once taken back to ``n``
    guessed: int | None = None  # the point that is a guess (:func:`leaving_count`)


def _leaving(ops: KvOps, slot: Slot, *, tail: int, min_tokens: int, turn_guess: bool = False) -> _Leaving:
    tokens = slot.tokens
    seq = slot.seq
    if saved_cuttable(ops):
        return _Leaving(True, [], None)
    end = min(slot.prompt_end, len(tokens))
    turn: int | None = None
    if getattr(slot, "turn", None) is not None:
        # the guess: as far below the tail as makes a point of its own (finding it reads every token's text)
        turn = end - max(1, tail) - 4 * TAIL - 1 if turn_guess else cast("Callable[[], int | None]", slot.turn)()
    # Where the prompt's last user message begins (a new session of the same agent, turns.py), and
    # where it parted from the cached prompt it shared most with: the next one shares it too.
    marks = [turn, getattr(slot, "parted", None)]
    if getattr(ops, "cuttable", True):
        # A cut lands anywhere here: just below what a repeat may reuse, so it prefills one token
        # (as llama-server's restored slot does), not TAIL (three more at 16k tokens: ~60 ms), and
        # at the marks.
        first = [end - max(1, tail), *(n for n in marks if n is not None and n < end)]
        positions = list(range(DEFAULT_INTERVAL, end, DEFAULT_INTERVAL))

        def back(n: int) -> int:
            return n if ops.window_ok(seq, n) and ops.truncate(seq, n) else 0

        def reachable(n: int) -> bool:
            return ops.window_ok(seq, n)
    else:

        def reachable(n: int) -> bool:
            return True  # a checkpoint of its own; rewinding to one fails only if llama.cpp refuses it

        ckpt = cast(CheckpointKv, ops)  # not cuttable: checkpoints

        def back(n: int) -> int:
            return ckpt.rewind(seq, n)

        positions = ckpt.positions(seq)  # the turn's and the parting's among them when prefilled here
        below_end = [p for p in positions if p < end]
        # the newest below the prompt's end (its tail: a repeat, the next turn), and the marks where the
        # prefill stopped for them (checkpoints.py): a state there exists only if it did
        first = [*below_end[-1:], *(m for m in marks if m is not None and m in positions)]
    points = leaving_points(positions, len(tokens), min_tokens=min_tokens, first=first)
    whole = not points or len(tokens) - points[0] > SHORT_ANSWER or not reachable(points[0])
    return _Leaving(whole, points, back, turn if turn_guess else None)


def leaving_count(
    ops: KvOps, slot: Slot, *, skip: Callable[[list[int]], bool], min_tokens: int, tail: int = TAIL
) -> int:
    """About how many states :func:`leaving_states` would save for ``slot`` now, without touching
    it, for memory made ready beforehand (state_memory.py). Where the prompt's last user message
    begins is guessed, not found (that reads every token's text, and most slots never leave): it
    counts as a point of its own, held when the others are."""
    plan = _leaving(ops, slot, tail=tail, min_tokens=min_tokens, turn_guess=True)
    tokens = slot.tokens
    guess = [n for n in plan.points if n == plan.guessed]
    parts = ([len(tokens)] if plan.whole else []) + [n for n in plan.points if n != plan.guessed]
    count = sum(1 for n in parts if n >= min_tokens and not skip(tokens[:n]))
    return count + len(guess) if count else 0


def leaving_states(
    ops: KvOps, slot: Slot, *, skip: Callable[[list[int]], bool], min_tokens: int, tail: int = TAIL
) -> list[tuple[list[int], Blob]]:
    """The states a slot leaves with when it is cleared (for host RAM or disk), as (tokens, blob).

    Its whole content first. Where a saved state restores at any prefix, that is all. Where it
    restores only whole (:func:`saved_cuttable`), the whole content is the prompt *and* the
    answer, which the next request rarely repeats token for token: a restart, a retry, the next
    turn and a new session sharing the system prompt would all find nothing. So the slot is also
    taken back to chosen positions below its end (:func:`leaving_points`) and saved there: just
    before the prompt's end (a repeat, the next turn), where its last user message begins (a new
    session of the same agent, turns.py), or else an earlier mark (a request that parts sooner).
    Memory that cannot be cut goes back to its checkpoints; a sliding-window model with a
    full-size cache is cut, at those points and every :data:`DEFAULT_INTERVAL`. The slot is left
    cut back: only for one that is about to be cleared. The whole content is left out where the
    first point is only a few tokens below it (:data:`SHORT_ANSWER`). ``skip(tokens)``: that
    state is held already; ``tail``: the tokens a repeat evaluates again (the cache's min_tail)."""
    seq, tokens = slot.seq, list(slot.tokens)
    out: list[tuple[list[int], Blob]] = []

    def keep(part: list[int]) -> None:
        if len(part) >= min_tokens and not skip(part):
            blob = ops.save(seq)
            if blob is not None:
                out.append((part, blob))

    plan = _leaving(ops, slot, tail=tail, min_tokens=min_tokens)
    back = cast("Callable[[int], int]", plan.back)  # None only where there are no points
    if plan.whole:
        keep(tokens)  # before the cuts: its answer, for the next turn
    for n in plan.points:
        if back(n) != n:
            break
        keep(tokens[:n])
    return out
