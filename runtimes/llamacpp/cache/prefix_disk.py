"""The disk tier under the prefix cache: slots, then host RAM, then state blobs on disk.

:class:`DiskSpill` is the policy; :mod:`.kv_disk`'s ``DiskTier`` does the files (atomic writes
on a background thread, checks on read, the byte budget). What host RAM evicts, and what a slot
evicts that host RAM cannot take, is spilled here; when the model unloads every slot's prefix
and every host entry not already on disk is written (:meth:`.prefix.PrefixCache.persist`). At
load the tier's entries for this model's :class:`StateKey` go into the cache's radix index as
owners of their own (ids after the slots and host entries), so a prompt sharing a long prefix
with one is restored instead of prefilled, when reading is cheaper than prefilling:
``nbytes / read_bytes_per_s`` (the tier's measured read speed) against ``tokens saved /
prefill tok/s``, the prefill speed measured on this context's own chunks (:meth:`observe_prefill`,
an average over recent chunks). Both speeds are kept beside the key's entries
(:data:`SPEEDS_FILE`, written when the session closes), so the first request after a restart, the
one a restore matters most to, is weighed with this machine's numbers; before anything was ever
timed :data:`PRIOR_PREFILL_TOK_S` stands in (about a 1B model's prefill on a laptop CPU).

The state copy out of llama.cpp (``llama_state_seq_get_data``) is a memcpy on the scheduler
thread; ``DiskTier.put`` queues the file write for its writer thread and returns at once, so a
request never waits for a write. A blob that fails its check or that llama.cpp refuses
(``llama_state_seq_set_data`` returns 0) is deleted and the request prefills.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from localrun.jsonfile import NotAJsonObject, open_regular, read_json_object
from localrun.runtimes.llamacpp.cache.radix import RadixIndex
from localrun.runtimes.llamacpp.speculative.pass_costs import ewma

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.kv_disk import DiskTier
    from localrun.runtimes.llamacpp.cache.kv_file import Blob
    from localrun.runtimes.llamacpp.cache.kv_root import DiskEntry
    from localrun.runtimes.llamacpp.cache.slots import Layout
    from localrun.types import ModelRecord

log = logging.getLogger(__name__)

#: Prefill tokens per second assumed before this model has ever timed a chunk here.
PRIOR_PREFILL_TOK_S = 2_000.0
#: The measured speeds, in the key's folder (not an entry: the tier lists ``*.kv`` files only).
SPEEDS_FILE = "speeds.json"
#: Chunks shorter than this are not timed: per-call overhead dominates them.
MIN_TIMED_CHUNK = 32
#: How long closing a session waits for queued writes (the worker host allows more, see manager).
FLUSH_TIMEOUT_S = 20.0


@dataclass
class _Owned:
    tokens: tuple[int, ...]
    nbytes: int
    entry: DiskEntry | None  # the DiskEntry; None until its queued write is found on disk


class DiskSpill:
    """Which prefixes the disk tier holds (as owners in ``index``), and when one is worth reading."""

    def __init__(self, tier: DiskTier, index: RadixIndex, ids: Iterator[int], *, whole_only: bool = False) -> None:
        self.tier = tier
        #: The model's saved states restore only whole (leaving.saved_cuttable): a longer entry
        #: does not hold a prefix of it.
        self.whole_only = whole_only
        self._index = index
        self._ids = ids
        self._owned: dict[int, _Owned] = {}
        self._prefill_tok_s: float | None = None
        self.hits = self.misses = self.restored_tokens = 0
        self._read_prior = float(getattr(tier, "read_bytes_per_s", 0.0) or 0.0)
        self._load_speeds()
        for entry in tier.entries():
            if getattr(entry, "kind", "prefix") == "prefix" and entry.tokens:
                self._add(tuple(entry.tokens), entry.nbytes, entry)
        if self._owned:
            log.info("disk cache: %d prefixes on disk for this model", len(self._owned))

    def __contains__(self, owner: object) -> bool:
        return owner in self._owned

    def tokens(self, owner: int) -> tuple[int, ...]:
        return self._owned[owner].tokens

    def _add(self, tokens: tuple[int, ...], nbytes: int, entry: DiskEntry | None) -> int:
        owner = next(self._ids)
        self._owned[owner] = _Owned(tokens, nbytes, entry)
        self._index.set(owner, tokens)
        return owner

    def newest(self, batch_s: float) -> int | None:
        """The owner of the longest entry on disk written within ``batch_s`` of the newest one
        (last use: a load refreshes it); None when there is none."""
        on_disk = [(o, got) for o, got in self._owned.items() if got.entry is not None]
        if not on_disk:
            return None
        last = max(float(getattr(got.entry, "used_at", 0.0)) for _, got in on_disk)
        recent = [
            (len(got.tokens), o) for o, got in on_disk if float(getattr(got.entry, "used_at", 0.0)) >= last - batch_s
        ]
        return max(recent)[1]

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether a disk entry has ``tokens`` or a longer sequence starting with them (a restore
        cut back to ``len(tokens)`` gives the same state, so writing them again buys nothing);
        where states restore only whole, an entry of exactly ``tokens``."""
        if self.whole_only:
            found, owners = self._index.whole(tokens, len(tokens))
        else:
            found, owners = self._index.longest(tokens)
        return found == len(tokens) and any(o in self._owned for o in owners)

    def spill(self, tokens: Sequence[int], blob: Blob) -> bool:
        """Queue ``blob`` (the state of exactly ``tokens``) for the disk; False when it is not kept."""
        if not tokens or self.holds(tokens):
            return False
        if not self.tier.put(tokens, blob, kind="prefix"):
            log.debug("disk cache: a %d-token prefix was not queued (queue full or over budget)", len(tokens))
            return False
        self._add(tuple(tokens), len(blob), None)
        return True

    # --- reading ------------------------------------------------------------------------------

    def observe_prefill(self, n_tokens: int, seconds: float) -> None:
        """A prefill chunk of ``n_tokens`` took ``seconds`` on this context."""
        if n_tokens >= MIN_TIMED_CHUNK and seconds > 0:
            self._prefill_tok_s = ewma(self._prefill_tok_s, n_tokens / seconds)

    @property
    def prefill_tok_s(self) -> float:
        return self._prefill_tok_s or PRIOR_PREFILL_TOK_S

    def worth(self, owner: int, keep: int) -> bool:
        """Reading ``owner``'s blob is cheaper than prefilling the ``keep`` tokens it saves."""
        rate = float(getattr(self.tier, "read_bytes_per_s", 0.0) or 0.0)
        if rate <= 0:
            return False
        return self._owned[owner].nbytes / rate < keep / self.prefill_tok_s

    def load(self, owner: int) -> memoryview | None:
        """``owner``'s blob, checked; None (and the owner forgotten) when it is gone or bad."""
        got = self._owned.get(owner)
        entry = got.entry if got is not None else None
        if got is not None and entry is None:
            entry = got.entry = self._find(got.tokens)
        if entry is None:
            # Not on disk (yet: still queued, or dropped by the budget): prefill this once.
            self.forget(owner)
            return None
        started = time.perf_counter()
        blob = self.tier.load(entry)
        if blob is None:  # failed its check: the tier deleted the file
            tokens = cast(_Owned, got).tokens  # an entry: the owner is known
            log.warning("disk cache: a saved %d-token prefix failed its check; prefilling", len(tokens))
            self.forget(owner)
            return None
        log.debug("disk cache: read %d bytes in %.3f s", len(blob), time.perf_counter() - started)
        return blob

    def _find(self, tokens: tuple[int, ...]) -> DiskEntry | None:
        return next((e for e in self.tier.entries() if tuple(e.tokens) == tokens), None)

    def restored(self, owner: int, keep: int) -> None:
        self.hits += 1
        self.restored_tokens += keep

    def refused(self, owner: int) -> None:
        """llama.cpp would not take ``owner``'s blob: delete it, it never will."""
        got = self._owned.get(owner)
        if got is not None and got.entry is not None:
            self.tier.discard(got.entry)
        self.forget(owner)

    def missed(self) -> None:
        """A long prompt found nothing to reuse in any tier (counted by the cache's ``acquire``)."""
        self.misses += 1

    def forget(self, owner: int) -> None:
        self._owned.pop(owner, None)
        self._index.discard(owner)

    # --- the books ----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        c = self.tier.counters()
        return {
            "disk_entries": int(c.get("entries", 0)),
            "disk_bytes": int(c.get("bytes", 0)),
            "disk_tokens": int(c.get("tokens", 0)),
            "disk_hits": self.hits,
            "disk_misses": self.misses,
            "disk_read_bytes": int(c.get("read_bytes", 0)),
            "disk_written_bytes": int(c.get("written_bytes", 0)),
            "disk_restored_tokens": self.restored_tokens,
        }

    def close(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Wait for queued writes (bounded), keep the measured speeds, then close the tier."""
        try:
            self.tier.flush(timeout_s)
            self._save_speeds()
        finally:
            self.tier.close()

    def _speeds_path(self) -> Path | None:
        folder = getattr(self.tier, "folder", None)
        return Path(folder) / SPEEDS_FILE if folder is not None else None

    def _load_speeds(self) -> None:
        path = self._speeds_path()
        if path is None or not path.is_file():
            return
        try:
            got = read_json_object(path)
            prefill, read = float(got.get("prefill_tok_s") or 0), float(got.get("read_bytes_per_s") or 0)
        except (NotAJsonObject, ValueError, TypeError) as exc:
            log.debug("disk cache: %s unreadable (%s); using priors", path, exc)
            return
        if prefill > 0:
            self._prefill_tok_s = prefill
        if read > 0:
            self.tier.read_bytes_per_s = self._read_prior = read

    def _save_speeds(self) -> None:
        """Atomically, like the entries: a torn file would only cost the priors, but costs nothing to avoid."""
        path = self._speeds_path()
        if path is None or not path.parent.is_dir():
            return
        read = float(getattr(self.tier, "read_bytes_per_s", 0.0) or 0.0)
        data = {"prefill_tok_s": self._prefill_tok_s, "read_bytes_per_s": read if read != self._read_prior else None}
        if self._prefill_tok_s is None and data["read_bytes_per_s"] is None:
            return
        if path.is_file():  # keep what this session did not measure
            try:
                old = read_json_object(path)
                data = {k: v if v is not None else old.get(k) for k, v in data.items()}
            except NotAJsonObject as exc:
                log.debug("disk cache: replacing unreadable %s (%s)", path, exc)
        tmp = path.with_name(f".{SPEEDS_FILE}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)
        except OSError as exc:
            log.debug("disk cache: could not keep the speeds in %s: %s", path, exc)


# --- the key and the tier for a session ---------------------------------------------------------


#: How much of each end of a file its fingerprint reads (where no sha256 is known).
FINGERPRINT_BYTES = 1 << 20


def model_sha256(record: ModelRecord) -> str:
    """The identity of every file the model loads (the projector is one of ``record.files``): its
    sha256 from the store where the record has one, else a fingerprint of the file as it is now
    (path, size, mtime and its first and last MiB: ``localrun import`` and discovery record no
    sha256 until ``localrun verify``, and those models deserve a disk cache too; a file replaced
    or touched gets a new key, so nothing saved for the old bytes is restored). "" when a file
    cannot be read: then there is no safe key."""
    files = [(f.path, f.sha256) for f in getattr(record, "files", ())] or [(getattr(record, "path", ""), None)]
    ids = []
    for path, sha in files:
        ident = sha or _fingerprint(path)
        if not ident:
            return ""
        ids.append(ident)
    if len(ids) == 1:
        return ids[0]
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


def _fingerprint(path: str) -> str:
    try:
        with open_regular(path) as f:
            st = os.fstat(f.fileno())
            h = hashlib.sha256(f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
            h.update(f.read(FINGERPRINT_BYTES))
            if st.st_size > FINGERPRINT_BYTES:
                f.seek(max(FINGERPRINT_BYTES, st.st_size - FINGERPRINT_BYTES))
                h.update(f.read(FINGERPRINT_BYTES))
    except OSError as exc:
        log.info("no disk cache key for %s: %s", path, exc)
        return ""
    return "fp-" + h.hexdigest()


def runtime_id(llama: Any) -> str:
    """llama-cpp-python's version, the backends of its llama.cpp build, and the CPU kernels it
    compiled (a different build computes the same prefix to other bits)."""
    from localrun.runtimes.llamacpp.build_info import build_backends

    version = getattr(llama, "__version__", "?")
    system = llama.llama_print_system_info() if hasattr(llama, "llama_print_system_info") else b""
    info = system.decode(errors="replace") if isinstance(system, bytes) else str(system)
    digest = hashlib.sha256(info.encode()).hexdigest()[:16]
    return f"llama-cpp-python {version}; backends {','.join(build_backends(llama)) or '?'}; kernels {digest}"


def state_params(llama: Any, model: Any, ctx: Any, cp: Any, layout: Layout) -> tuple[tuple[str, str], ...]:
    """Every context parameter that shapes a sequence's state blob (or its arithmetic)."""
    n_ctx_seq = llama.llama_n_ctx_seq(ctx) if hasattr(llama, "llama_n_ctx_seq") else llama.llama_n_ctx(ctx)
    got = {
        "type_k": cp.type_k,
        "type_v": cp.type_v,
        "n_ctx_seq": n_ctx_seq,
        "n_swa": llama.llama_model_n_swa(model),
        "swa_full": bool(cp.swa_full),
        "flash_attn": int(cp.flash_attn_type),  # without it V is stored transposed
        "rope_freq_base": float(cp.rope_freq_base),
        "rope_freq_scale": float(cp.rope_freq_scale),
        "rope_scale_train": float(llama.llama_model_rope_freq_scale_train(model)),
        "n_embd": llama.llama_model_n_embd(model),
        "n_layer": llama.llama_model_n_layer(model),
        "unified": bool(layout.unified),
        "exact_prefix": bool(layout.exact_prefix),  # how its prefill was chunked
        "state": "full",  # whole-sequence blobs (checkpoints of partial state carry their own kind)
    }
    return tuple(sorted((k, str(v)) for k, v in got.items()))


def open_disk_tier(llama: Any, model: Any, ctx: Any, cp: Any, record: ModelRecord, layout: Layout) -> DiskTier | None:
    """The disk tier for this session, or None (off, no sha256 in the record, no store module)."""
    if not layout.kv_dir or layout.kv_disk_bytes == 0:
        return None
    sha = model_sha256(record)
    if not sha:
        log.info("disk cache off for %s: its files cannot be read for a key", record.name)
        return None
    try:
        from localrun.runtimes.llamacpp.cache import kv_disk
    except ImportError as exc:  # the tier's module is a separate part; without it the cache stays in memory
        log.warning("disk cache off: %s", exc)
        return None
    root = Path(layout.kv_dir)
    budget = layout.kv_disk_bytes if layout.kv_disk_bytes is not None else kv_disk.default_budget(root)
    if budget <= 0:
        log.info("disk cache off for %s: no disk budget at %s", record.name, root)
        return None
    key = kv_disk.StateKey(
        model_sha256=sha,
        runtime=runtime_id(llama),
        params=state_params(llama, model, ctx, cp, layout),
        model_name=record.name,
    )
    try:
        tier = kv_disk.DiskTier(root, key, budget_bytes=int(budget))
    except OSError as exc:
        log.warning("disk cache off for %s: %s: %s", record.name, root, exc)
        return None
    log.info("disk cache for %s: %s (key %s, budget %d MiB)", record.name, root, key.digest()[:12], budget >> 20)
    return tier
