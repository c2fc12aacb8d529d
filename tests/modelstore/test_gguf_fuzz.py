"""Seeded mutation fuzz of the GGUF validator: every mutated file is either accepted or
InvalidModelFile — nothing else escapes, nothing takes more than 2 s — and whatever is
accepted is also readable by the ``gguf`` package with the same layout."""

from __future__ import annotations

import logging
import random
import struct
import time

import pytest

from localrun.errors import InvalidModelFile
from localrun.modelstore.gguf_meta import read_gguf_metadata
from tests.factories import ARRAY, F32, STRING, U32, RawGGUF, mutate, write_tiny_llama_gguf

MUTATIONS_PER_SEED = 1000


def _small_raw() -> bytes:
    """Header-dense: most mutations land in keys, types, counts, shapes and offsets."""
    return RawGGUF(
        kvs=[
            ("general.architecture", STRING, "llama", None),
            ("general.alignment", U32, 32, None),
            ("llama.block_count", U32, 2, None),
            ("llama.attention.head_count_kv", ARRAY, [2, 4], U32),
            ("tokenizer.ggml.tokens", ARRAY, ["<unk>", "a", "bc"], STRING),
            ("general.scale", F32, 0.5, None),
        ],
        tensors=[("a.weight", (8, 2), 0, 0), ("b.weight", (32,), 8, 64), ("c.weight", (4,), 0, 128)],
    ).to_bytes()


def _seeds(tmp_path) -> dict[str, bytes]:
    tiny = write_tiny_llama_gguf(tmp_path / "seed.gguf", n_embd=8, n_head=2, n_head_kv=1, n_ff=16, n_layer=1)
    return {"raw": _small_raw(), "tiny-llama": tiny.read_bytes()}


@pytest.mark.slow
@pytest.mark.parametrize("seed_name", ["raw", "tiny-llama"])
def test_mutated_files_are_valid_or_invalid_model_file(tmp_path, seed_name, caplog):
    from gguf import GGUFReader

    caplog.set_level(logging.ERROR, logger="gguf")
    base = _seeds(tmp_path)[seed_name]
    read_gguf_metadata(_write(tmp_path / "base.gguf", base))  # the seed itself is valid
    rng = random.Random(f"localrun-gguf-fuzz-{seed_name}")
    path = tmp_path / "m.gguf"
    accepted = rejected = 0
    slowest = 0.0
    reasons: dict[str, int] = {}
    for i in range(MUTATIONS_PER_SEED):
        data = mutate(base, rng)
        if rng.random() < 0.3:
            data = mutate(data, rng)
        _write(path, data)
        t0 = time.perf_counter()
        try:
            info = read_gguf_metadata(path)
        except InvalidModelFile as exc:
            rejected += 1
            assert "internal error" not in exc.message, (i, exc.message)
            assert exc.message.startswith(str(path))
            reason = exc.message[len(str(path)) + 2 :].split(" ")[0]
            reasons[reason] = reasons.get(reason, 0) + 1
        else:
            accepted += 1
            # Differential check: the reference reader sees the same layout.
            ref = GGUFReader(path)
            assert len(ref.tensors) == info.tensor_count, i
            assert ref.data_offset == info.data_offset, i
            assert [t.n_bytes for t in ref.tensors] == [t.n_bytes for t in info.tensors], i
        slowest = max(slowest, time.perf_counter() - t0)
        assert slowest < 2.0, (i, slowest)
    # Both outcomes happen, so the fuzz is exercising the checks and not only the magic test.
    assert accepted > 20 and rejected > 200, (accepted, rejected, reasons)
    assert len(reasons) >= 5, reasons


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_mutator_is_deterministic():
    base = _small_raw()
    a = [mutate(base, random.Random(7)) for _ in range(3)]
    b = [mutate(base, random.Random(7)) for _ in range(3)]
    assert a == b and any(m != base for m in a)


def test_interesting_integers_in_every_header_u64(tmp_path):
    """Stamp 0, 1, 2^63, 2^64-1, 2^64-64 over every 8-byte-aligned header word of a small file."""
    base = _small_raw()
    head_len = len(RawGGUF().header()) + 400
    path = tmp_path / "s.gguf"
    outcomes = set()
    for off in range(4, min(head_len, len(base) - 8)):
        for value in (0, 1, 2**63, 2**64 - 1, 2**64 - 64):
            buf = bytearray(base)
            buf[off : off + 8] = struct.pack("<Q", value)
            _write(path, bytes(buf))
            t0 = time.perf_counter()
            try:
                read_gguf_metadata(path)
                outcomes.add("ok")
            except InvalidModelFile as exc:
                assert "internal error" not in exc.message
                outcomes.add("invalid")
            assert time.perf_counter() - t0 < 2.0
    assert outcomes == {"ok", "invalid"}
