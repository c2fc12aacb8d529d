"""llama-server's slot API on a llama.cpp session: ``GET /slots``, ``POST /slots/{id}?action=
save|restore|erase``, ``id_slot`` on a request, and the cache's numbers for ``ps`` and ``/metrics``.

A slot is one sequence of the session's context (:class:`~.cache.slot.Slot`). What llama-server
does, and what localrun does the same:

* A slot file is llama.cpp's sequence-state file, byte for byte what
  ``llama_state_seq_save_file`` writes (magic, version, token count, tokens, then the state of
  ``llama_state_seq_get_data``), so llama-server restores localrun's files and localrun
  restores llama-server's (its plain token lists and its packed text-only ones).
* An action on a busy slot waits until the slot is idle (llama-server defers the task), here
  for at most :data:`WAIT_IDLE_S`; then it is a 503.
* A file that does not fit (more tokens than the slot's context, tokens outside the
  vocabulary, a state llama.cpp refuses) is a 400 and leaves the slot empty.

Where localrun differs, and why: the file is read and written on the request's thread, not on
the scheduler's (only the in-memory copy of the state runs there, between two steps), so a
save or restore never stalls the other slots' decoding on disk I/O; a save goes to a temporary
name in the folder and is renamed into place after an fsync, so a crash mid-write never leaves
a half file under the client's name, and a symlink planted under that name is replaced, not
followed. A slot holding an image or audio chunk is not saved (its pseudo tokens mean nothing
to another process; llama-server packs the media, which localrun does not restore).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from localrun.errors import Overloaded, SlotError
from localrun.jsonfile import NotARegularFile, open_regular

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.kv_file import Blob
    from localrun.runtimes.llamacpp.cache.slot import Slot
    from localrun.runtimes.llamacpp.scheduler import Scheduler

T = TypeVar("T")

log = logging.getLogger(__name__)

#: How long a save, restore or erase waits for a busy slot's request to end.
WAIT_IDLE_S = 60.0
#: llama.h: LLAMA_STATE_SEQ_MAGIC ('ggsq') and LLAMA_STATE_SEQ_VERSION of the llama.cpp localrun ships.
STATE_SEQ_MAGIC = 0x67677371
STATE_SEQ_VERSION = 3
#: llama-context.cpp's ``io_magic``: the buffer form of a sequence's state (``llama_state_seq_get_data``)
#: starts with it and the sequence id; the file form does not. Tied to this build: the file
#: test (tests/batching/test_slot_files.py) compares with ``llama_state_seq_save_file`` byte for byte.
IO_MAGIC = struct.pack("<I", 0xAF143CD8)
#: llama-server's packed token list starts with LLAMA_TOKEN_NULL, then its own version.
TOKEN_NULL = -1
ACTIONS = ("save", "restore", "erase")


def slot_file(folder: str | os.PathLike[str], filename: str) -> Path:
    """``filename`` inside ``folder``, checked again here (the server checked it first): a plain
    name whose path stays in the folder, also through a symlink."""
    if not filename or "/" in filename or "\\" in filename or "\0" in filename or filename in (".", ".."):
        raise SlotError(f"invalid slot file name {filename[:80]!r}", param="filename", hint="send a plain file name")
    root = Path(folder).resolve()
    path = root / filename
    if path.resolve().parent != root:
        raise SlotError(
            f"slot file name {filename[:80]!r} resolves outside the slot folder", param="filename", hint="pick another"
        )
    return path


def pack(tokens: list[int], state: Blob) -> bytes:
    """The sequence-state file llama.cpp writes: magic, version, token count, tokens, state."""
    return struct.pack(f"<III{len(tokens)}i", STATE_SEQ_MAGIC, STATE_SEQ_VERSION, len(tokens), *tokens) + state


def file_state(buffer: Blob) -> Blob:
    """A state from ``llama_state_seq_get_data`` as the file holds it (without the buffer's header)."""
    return buffer[8:] if buffer[:4] == IO_MAGIC else buffer


def buffer_state(state: bytes, seq: int) -> bytes:
    """A file's state as ``llama_state_seq_set_data`` reads it into ``seq``."""
    return IO_MAGIC + struct.pack("<i", seq) + state


def unpack(data: bytes, name: str) -> tuple[list[int], bytes]:
    """(tokens, state) of a sequence-state file; SlotError for anything else."""
    if len(data) < 12:
        raise SlotError(f"{name!r} is not a llama.cpp slot file (it is {len(data)} bytes)", param="filename")
    magic, version, n = struct.unpack_from("<III", data)
    if magic != STATE_SEQ_MAGIC:
        raise SlotError(f"{name!r} is not a llama.cpp slot file", param="filename")
    if version != STATE_SEQ_VERSION:
        raise SlotError(
            f"{name!r} holds llama.cpp sequence state version {version}, this llama.cpp reads {STATE_SEQ_VERSION}",
            param="filename",
            hint="save the slot again with this version",
        )
    end = 12 + 4 * n
    if end > len(data):
        raise SlotError(f"{name!r} is cut short: it claims {n} tokens", param="filename")
    tokens = list(struct.unpack_from(f"<{n}i", data, 12))
    return _plain_tokens(tokens, name), data[end:]


def _plain_tokens(packed: list[int], name: str) -> list[int]:
    """llama-server's packed list (NULL, version, n, tokens, media count, media) as plain tokens;
    a plain list as it is."""
    if not packed or packed[0] != TOKEN_NULL:
        return packed
    if len(packed) < 4 or packed[2] < 0 or 3 + packed[2] >= len(packed):
        raise SlotError(f"{name!r} holds a token list this server cannot read", param="filename")
    n = packed[2]
    if packed[3 + n] != 0 or len(packed) != 4 + n:
        raise SlotError(
            f"{name!r} holds image or audio chunks, which localrun does not restore from a slot file",
            param="filename",
            hint="save a slot that holds text only",
        )
    return packed[3 : 3 + n]


class SlotApi:
    """llama-server's slot API on one session's scheduler, held by the session (its ``serve_slots``,
    ``serve_slot_action``, ``serve_cache_stats`` and a request's ``id_slot``). Everything that
    touches a slot runs on the scheduler thread, through :meth:`~.scheduler.Scheduler.call`."""

    def __init__(self, sched: Scheduler, llama: Any, ctx: Any, *, name: str, n_ctx: int, n_vocab: int) -> None:
        self._sched, self._llama, self._ctx = sched, llama, ctx
        self._name, self._n_ctx, self._n_vocab = name, n_ctx, n_vocab

    # --- reads (run on the scheduler thread, between two steps: one consistent picture) ---------

    def slots(self) -> list[dict[str, Any]]:
        """Each slot as llama-server's ``GET /slots`` lists it (without prompt text, as its default)."""
        return self._sched.call(self._slot_rows)

    def _slot_rows(self) -> list[dict[str, Any]]:
        sched = self._sched
        jobs = sched.jobs_by_slot()
        rows = []
        for slot in sched.cache.slots:
            row: dict[str, Any] = {
                "id": slot.seq,
                "n_ctx": self._n_ctx,
                "speculative": sched.speculative != "off",
                "is_processing": slot.busy,
                "n_prompt_tokens": len(slot.tokens),  # what the slot holds (llama-server: its cache's size)
            }
            job = jobs.get(slot.seq)
            if job is not None:
                row["n_prompt_tokens_processed"] = len(job.prompt) - job.cached
                row["n_prompt_tokens_cache"] = job.cached
                row["next_token"] = [
                    {
                        "has_next_token": True,
                        "has_new_line": False,
                        "n_remain": max(0, job.limit - job.produced),
                        "n_decoded": job.produced,
                    }
                ]
            rows.append(row)
        return rows

    def cache_stats(self) -> dict[str, Any]:
        """The prefix cache's counters and holdings (RAM and disk), and what the slots hold."""

        def read() -> dict[str, Any]:
            cache = self._sched.cache
            out = dataclasses.asdict(cache.stats())
            out["slots"] = len(cache.slots)
            out["slot_tokens"] = sum(len(s.tokens) for s in cache.slots)
            out["slots_busy"] = sum(s.busy for s in cache.slots)
            out["slots_held"] = sum(bool(s.tokens) for s in cache.slots)
            out["n_ctx"] = self._n_ctx
            return out

        return self._sched.call(read)

    # --- llama-server's POST /slots/{id} ----------------------------------------------------------

    def action(self, id_slot: int, action: str, folder: str = "", filename: str = "") -> dict[str, Any]:
        """Save slot ``id_slot`` to ``folder/filename``, restore it from there, or erase it."""
        if action not in ACTIONS:
            raise SlotError(
                f"unknown slot action {action[:40]!r}", param="action", hint="use one of: save, restore, erase"
            )
        self._check_slot(id_slot)
        started = time.perf_counter()
        if action == "erase":
            n = self._when_idle(id_slot, self._erase_now)
            return {"id_slot": id_slot, "n_erased": n}
        path = slot_file(folder, filename)
        if action == "save":
            tokens, state = self._when_idle(id_slot, self._snapshot_now)
            n_written = _write_atomic(path, pack(tokens, state))
            log.info("%s: slot %d saved to %s (%d tokens, %d bytes)", self._name, id_slot, path, len(tokens), n_written)
            return {
                "id_slot": id_slot,
                "filename": filename,
                "n_saved": len(tokens),
                "n_written": n_written,
                "timings": {"save_ms": round((time.perf_counter() - started) * 1e3, 3)},
            }
        data = _read_file(path, filename, self._max_file_bytes())
        tokens, state = unpack(data, filename)
        self._check_fits(tokens, filename)
        self._when_idle(id_slot, lambda slot: self._restore_now(slot, tokens, state, filename))
        log.info("%s: slot %d restored from %s (%d tokens)", self._name, id_slot, path, len(tokens))
        return {
            "id_slot": id_slot,
            "filename": filename,
            "n_restored": len(tokens),
            "n_read": len(data),
            "timings": {"restore_ms": round((time.perf_counter() - started) * 1e3, 3)},
        }

    def pinned_slot(self, sampling: Any) -> int:
        """A request's ``id_slot`` checked against this context: -1 (any) or a slot that exists."""
        want = int(getattr(sampling, "id_slot", -1))
        if want < 0:
            return -1
        self._check_slot(want)
        return want

    def _check_slot(self, id_slot: int) -> None:
        n = self._sched.layout.n_slots
        if not 0 <= id_slot < n:
            raise SlotError(
                f"slot {id_slot} does not exist: {self._name} has {n} slot{'s' if n > 1 else ''} (0..{n - 1})",
                param="id_slot",
                hint="GET /slots lists them",
            )

    def _max_file_bytes(self) -> int:
        """A bound on the slot files this context could have written: the header, a full context's
        token ids (llama-server's packed list adds four) and a state no larger than f32 keys and
        values of ``n_embd`` per layer for every position, twice over (the state's own metadata, a
        recurrent layer's fixed state); a larger file is refused before a byte of it is read."""
        model = self._llama.llama_get_model(self._ctx)
        n_layer, n_embd = int(self._llama.llama_model_n_layer(model)), int(self._llama.llama_model_n_embd(model))
        per_position = 2 * n_layer * 2 * n_embd * 4
        return 12 + 4 * (self._n_ctx + 4) + per_position * (self._n_ctx + 64) + (1 << 20)

    def _check_fits(self, tokens: list[int], name: str) -> None:
        if len(tokens) > self._n_ctx:
            raise SlotError(
                f"{name!r} holds {len(tokens)} tokens, more than a slot's context of {self._n_ctx}",
                param="filename",
                hint="load the model with a larger context, or restore a file saved from this one",
            )
        bad = next((t for t in tokens if not 0 <= t < self._n_vocab), None)
        if bad is not None:
            raise SlotError(
                f"{name!r} holds token {bad}, outside {self._name}'s vocabulary of {self._n_vocab}",
                param="filename",
                hint="restore a file saved from this model",
            )

    def _when_idle(self, id_slot: int, fn: Callable[[Slot], T]) -> T:
        """``fn(slot)`` on the scheduler thread once slot ``id_slot`` is idle (polled, as llama-server
        defers its task); a 503 when it stays busy for :data:`WAIT_IDLE_S`."""
        deadline = time.monotonic() + WAIT_IDLE_S
        marker = object()

        def attempt() -> T | object:
            slot = self._sched.cache.slots[id_slot]
            return marker if slot.busy else fn(slot)

        while True:
            got = self._sched.call(attempt)
            if got is not marker:
                return cast(T, got)
            if time.monotonic() >= deadline:
                raise Overloaded(
                    f"slot {id_slot} of {self._name} stayed busy for {WAIT_IDLE_S:.0f} s",
                    hint="retry when its request ends",
                    param="id_slot",
                )
            time.sleep(0.05)

    # --- on the scheduler thread ---------------------------------------------------------------

    def _erase_now(self, slot: Slot) -> int:
        n = len(slot.tokens)
        self._sched.cache.drop(slot)
        return n

    def _snapshot_now(self, slot: Slot) -> tuple[list[int], Blob]:
        tokens = list(slot.tokens)
        if any(t < 0 for t in tokens):
            raise SlotError(
                f"slot {slot.seq} holds an image or audio chunk, which a slot file cannot carry here",
                param="id_slot",
                hint="erase it, or save a slot that holds text only",
            )
        state = self._sched.cache.save_state(slot)
        if state is None:
            raise SlotError(f"llama.cpp could not copy slot {slot.seq}'s state", param="id_slot")
        return tokens, file_state(state)

    def _restore_now(self, slot: Slot, tokens: list[int], state: bytes, name: str) -> None:
        cache = self._sched.cache
        if not cache.restore_state(slot, buffer_state(state, slot.seq)):
            raise SlotError(
                f"llama.cpp refused the state in {name!r}: it was saved from another model or context layout",
                param="filename",
                hint="restore a file saved from this model with the same context settings",
            )
        held: int = self._llama.llama_memory_seq_pos_max(self._llama.llama_get_memory(self._ctx), slot.seq) + 1
        if held != len(tokens):
            cache.drop(slot)
            raise SlotError(
                f"{name!r} lists {len(tokens)} tokens but its state holds {held} positions",
                param="filename",
                hint="the file is damaged: save the slot again",
            )
        cache.adopt(slot, tokens)


def _read_file(path: Path, name: str, max_bytes: int) -> bytes:
    """The slot file, if it is a regular file of at most ``max_bytes`` (a FIFO is refused, not waited on)."""
    try:
        f = open_regular(path, max_bytes=max_bytes, follow_symlinks=False)
    except FileNotFoundError:
        raise SlotError(f"no slot file named {name!r} in the slot folder", param="filename") from None
    except NotARegularFile as exc:
        raise SlotError(
            f"slot file {name!r} {exc.why}", param="filename", hint="restore a file this server saved"
        ) from None
    except OSError as exc:
        raise SlotError(f"cannot read slot file {name!r}: {exc.strerror}", param="filename") from None
    with f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SlotError(f"slot file {name!r} grew past {max_bytes:,} bytes while it was read", param="filename")
    return data


def _write_atomic(path: Path, data: bytes) -> int:
    """``data`` at ``path`` by a temporary name, fsync and rename: never half a file under the name."""
    tmp = path.with_name(f".{path.name[:200]}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return len(data)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return len(data)
