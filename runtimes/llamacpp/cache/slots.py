"""How one llama.cpp context is cut into sequences (slots), and the KV operations on them.

:class:`Layout` turns a plan's options into slot count, context per slot, step budget and
the exactness settings. :class:`LlamaKvOps` is the prefix cache's window onto llama.cpp's
memory and per-sequence state API.

Exactness, measured on this project's CPU build (llama-cpp-python 0.3.36, x86 AVX2, Gemma 3
270M and the tiny F32 model):

* A decode micro-batch of 1-7 rows gives each row exactly what it gets alone; from 8 rows
  on, other matmul kernels round differently (about 4 in 10 rows differ), and repacked
  weights (Q4_K 8x8) already from 4 rows. So ``batch_invariant`` layouts (the CPU default
  up to 7 slots) run without repacking (no speed lost here) and decode in calls of at most
  7 rows. Prefill chunks depend only on the request itself. Then a greedy answer is the
  same bit for bit alone or batched with any others. With 8 or more slots the 8-row kernels
  are worth more (186 against 117 tok/s at 8 streams here): those layouts decode every
  running sequence in one call unless ``batch_invariant`` is set.
* A prefill's result depends on how it was chunked: with flash attention at any chunk size;
  without it only for chunks of 2-7 rows, which take the small-batch kernels. A cached
  prefix is therefore right to rounding, not bit-identical, to a cold prefill. With
  ``exact_prefix``: no flash attention, prefill chunks of at least 8 rows (``min_chunk``;
  a whole prompt shorter than that is one chunk), at least 8 prompt tokens evaluated again
  after a cached prefix, and a prompt's prefix from the cache gives the same answer as
  cold. It is opt-in: flash attention is 7 % faster at short contexts and 36 % at 4,000
  tokens here. A cached prefix that includes *generated* tokens (a second chat turn) was
  computed 1-7 rows at a time, not like a prefill, so it stays right to rounding only.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localrun.errors import ConfigError
from localrun.runtimes.llamacpp.cache import kv_file
from localrun.runtimes.llamacpp.cache.state_memory import ReadyBuffers, shrink
from localrun.settings import default_kv_ram_bytes
from localrun.types import Plan

log = logging.getLogger(__name__)

#: Micro-batches of fewer rows than this use other matmul kernels than longer ones (see above).
MIN_CHUNK = 8
#: Defaults when the plan does not say: slots of at least this many tokens, at most 4 of them,
#: carved out of the plan's context, so the KV cache stays the size the planner counted.
DEFAULT_SLOT_CTX = 2048
MAX_DEFAULT_SLOTS = 4
DEFAULT_STEP_TOKENS = 256


@dataclass(frozen=True)
class Layout:
    """How the context is cut into sequences, and the step budget."""

    n_slots: int
    slot_ctx: int  # tokens one request may use (prompt + answer)
    unified: bool  # one KV pool shared by all slots, or one stream per slot
    step_tokens: int  # prefill tokens per step
    min_chunk: int  # shortest prefill chunk (1: no constraint)
    decode_rows: int  # most sequences decoded in one call
    host_cache_bytes: int  # host-RAM tier for evicted prefixes (0: off)
    prefix_cache: bool = True  # False: every prompt is prefilled cold (for comparisons)
    exact: bool = False  # batch-invariant: a request's tokens do not depend on the others
    exact_prefix: bool = False  # and a cached prompt prefix gives what a cold prefill gives
    kv_dir: str | None = None  # the disk tier's folder (None: no disk tier; prefix_disk.py)
    kv_disk_bytes: int | None = None  # its byte budget (None: kv_disk.default_budget; 0: off)
    checkpoints: int = 8  # state checkpoints per sequence where the memory cannot be cut (checkpoints.py)

    @property
    def n_ctx(self) -> int:
        """The context size to ask llama.cpp for."""
        return self.slot_ctx if self.unified else self.slot_ctx * self.n_slots

    @classmethod
    def from_plan(cls, plan: Plan) -> Layout:
        """Read ``n_slots``, ``slot_ctx``, ``kv_unified``, ``step_tokens``, ``host_cache_mib`` (or
        ``kv_ram_bytes``), ``kv_dir``, ``kv_disk_bytes``, ``prefix_cache``, ``batch_invariant`` and
        ``exact_prefix`` from ``plan.options``.

        The planner sets ``n_slots`` and ``slot_ctx`` (each slot the plan's whole context, the
        KV of all of them counted in its estimate). A plan built without them (tests, tools)
        has the slots share its ``n_ctx`` (as many 2,048-token slots as fit, up to 4; one slot
        below 4,096 tokens), so memory stays within that plan's KV estimate. ``batch_invariant``
        defaults to on for the CPU with at most 7 slots, where it costs nothing measurable; with 8
        or more it would keep decode steps off the faster 8-row kernels (here 117 instead of 186
        tok/s at 8 streams), so it is off unless asked for. GPU kernels differ with batch size anyway."""
        opts = plan.options
        try:
            unified = bool(opts.get("kv_unified", False))
            n_slots = int(_given(opts, "n_slots", max(1, min(MAX_DEFAULT_SLOTS, plan.n_ctx // DEFAULT_SLOT_CTX))))
            slot_ctx = int(_given(opts, "slot_ctx", plan.n_ctx if unified else plan.n_ctx // max(1, n_slots)))
            step = int(_given(opts, "step_tokens", min(plan.n_batch, DEFAULT_STEP_TOKENS)))
            host = host_ram_bytes(opts)
            disk = opts.get("kv_disk_bytes")
            disk = None if disk is None else int(disk)
            checkpoints = int(_given(opts, "checkpoints", 8))  # settings cache.checkpoints, via the planner
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"bad llama.cpp slot options {opts!r}: {exc}",
                hint="n_slots, slot_ctx, step_tokens, host_cache_mib, kv_ram_bytes and kv_disk_bytes are numbers",
            ) from exc
        flag = opts.get("batch_invariant")
        on_cpu = plan.device == "cpu" and int(plan.n_gpu_layers) == 0
        exact_prefix = bool(opts.get("exact_prefix", False))
        exact = exact_prefix or (bool(flag) if flag is not None else on_cpu and n_slots < MIN_CHUNK)
        min_chunk = MIN_CHUNK if exact_prefix else 1
        decode_rows = MIN_CHUNK - 1 if exact else n_slots
        bad_counts = host < 0 or (disk or 0) < 0 or not 0 <= checkpoints <= 256
        if not 1 <= n_slots <= 256 or slot_ctx < 16 or step < 1 or bad_counts:
            raise ConfigError(
                f"llama.cpp slots out of range: n_slots={n_slots} slot_ctx={slot_ctx} "
                f"step_tokens={step} host_cache_mib={opts.get('host_cache_mib')}",
                hint="use 1-256 slots of at least 16 tokens and a positive step",
            )
        return cls(
            n_slots=n_slots,
            slot_ctx=slot_ctx,
            unified=unified,
            step_tokens=max(step, 2 * min_chunk),
            min_chunk=min_chunk,
            decode_rows=decode_rows,
            host_cache_bytes=host,
            prefix_cache=bool(opts.get("prefix_cache", True)),
            exact=exact,
            exact_prefix=exact_prefix,
            kv_dir=str(opts["kv_dir"]) if opts.get("kv_dir") else None,
            kv_disk_bytes=disk,
            checkpoints=checkpoints,
        )


def host_ram_bytes(opts: dict[str, Any]) -> int:
    """The host-RAM tier's bytes: ``host_cache_mib`` where given, else ``kv_ram_bytes`` (settings'
    ``cache.kv_ram_bytes``; the planner puts its choice there and counts it in the plan's memory),
    else :func:`localrun.settings.default_kv_ram_bytes` of the RAM available now."""
    if opts.get("host_cache_mib") is not None:
        return int(float(opts["host_cache_mib"]) * 2**20)
    if opts.get("kv_ram_bytes") is not None:
        return int(opts["kv_ram_bytes"])
    try:
        import psutil

        return default_kv_ram_bytes(psutil.virtual_memory().available)
    except (ImportError, OSError) as exc:
        log.debug("free RAM unknown (%s): the host-RAM prefix tier is off", exc)
        return 0


def _given(opts: dict[str, Any], key: str, default: Any) -> Any:
    value = opts.get(key)
    return default if value is None else value


def state_source(blob: kv_file.Blob) -> ctypes._Pointer[ctypes.c_uint8] | ctypes.Array[ctypes.c_uint8]:
    """The blob as the ``const uint8_t *`` llama.cpp restores a state from, without a copy: for a
    16k-token Gemma state (57 MB) a copy cost ~55 ms of a restart's first request."""
    if isinstance(blob, bytes):  # c_char_p points into the bytes object itself
        return ctypes.cast(ctypes.c_char_p(blob), ctypes.POINTER(ctypes.c_uint8))
    if isinstance(blob, memoryview) and blob.readonly:
        return (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
    return (ctypes.c_uint8 * len(blob)).from_buffer(blob)


def read_state(
    size: int, get: Callable[[ctypes.Array[ctypes.c_uint8], int], int], buffers: ReadyBuffers | None = None
) -> kv_file.Blob | None:
    """A state of ``size`` bytes that ``get(dst, size)`` (llama.cpp's ``state_seq_get_data``)
    writes straight into memory, with no copy after it: a buffer ``buffers``
    (state_memory.ReadyBuffers) made ready beforehand, else fresh memory, huge pages where the OS
    has them.

    Eviction saves on the scheduler thread, so this is decoding time: a 57 MB Gemma state put
    in a zeroed ctypes array and copied to bytes took 0.25-0.6 s on a busy 2-core VM, where a
    page fault costs ~17 us and both buffers fault all 14k of their pages; here ~30 faults, and
    none in a ready buffer."""
    if size <= 0:
        return None
    buf = buffers.take(size) if buffers is not None else None
    if buf is None:
        buf = kv_file.blob_buffer(size)
    dst = (ctypes.c_uint8 * size).from_buffer(buf)
    got = get(dst, size)
    del dst  # the export ends here: a buffer cannot shrink while one is held
    if not got:
        return None
    return shrink(buf, got)  # llama.cpp writes what it sized; a ready buffer is bigger


def chunk_size(remaining: int, step: int, min_chunk: int) -> int:
    """The next prefill chunk: ``step`` tokens, never leaving a tail shorter than ``min_chunk``."""
    if remaining <= step:
        return remaining
    if remaining - step >= min_chunk:
        return step
    return remaining - min_chunk


class LlamaKvOps:
    """:class:`~.slot.KvOps` on llama.cpp's memory and per-sequence state API."""

    def __init__(self, llama: Any, ctx: Any, *, n_swa: int, buffers: ReadyBuffers | None = None) -> None:
        self._llama, self._ctx, self._n_swa = llama, ctx, n_swa
        #: Memory made ready for saves (state_memory.ReadyBuffers), or None.
        self.buffers = buffers
        self._mem = llama.llama_get_memory(ctx)
        # A sliding-window model's saved state holds only the window's cells of those layers,
        # full-size cache or not (llama.cpp writes what the window can see): it restores whole.
        self.saved_cuttable = n_swa <= 0

    def clear(self, seq: int) -> None:
        self._llama.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def truncate(self, seq: int, keep: int) -> bool:
        return bool(self._llama.llama_memory_seq_rm(self._mem, seq, keep, -1))

    def copy(self, src: int, dst: int) -> None:
        # Whole sequences only: across KV streams llama.cpp copies full buffers (it asserts so).
        self._llama.llama_memory_seq_rm(self._mem, dst, -1, -1)
        self._llama.llama_memory_seq_cp(self._mem, src, dst, -1, -1)

    def window_ok(self, seq: int, keep: int) -> bool:
        """A sliding-window cache forgets old positions: reuse ``keep`` tokens only if the
        window before ``keep`` is all there (llama-server's rule)."""
        if self._n_swa <= 0:
            return True
        pos_min: int = self._llama.llama_memory_seq_pos_min(self._mem, seq)
        return 0 <= pos_min <= max(0, keep - self._n_swa)

    def state_size(self, seq: int) -> int:
        """The bytes :meth:`save` would take now (llama.cpp sizes it without copying)."""
        return int(self._llama.llama_state_seq_get_size(self._ctx, seq))

    def save(self, seq: int) -> kv_file.Blob | None:
        get = self._llama.llama_state_seq_get_data
        return read_state(self.state_size(seq), lambda dst, n: get(self._ctx, dst, n, seq), self.buffers)

    def restore(self, seq: int, blob: kv_file.Blob) -> bool:
        return bool(self._llama.llama_state_seq_set_data(self._ctx, state_source(blob), len(blob), seq))
