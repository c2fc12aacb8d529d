"""GGUF metadata: correct values from good files, InvalidModelFile for every bad one, fast."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from localrun.errors import InvalidModelFile
from localrun.modelstore import gguf_walk
from localrun.modelstore.gguf_meta import open_gguf_reader, quant_label, read_gguf_metadata
from tests.factories import (
    ARRAY,
    F32,
    I32,
    STRING,
    U8,
    U32,
    U64,
    Raw,
    RawGGUF,
    write_meta_only_gguf,
    write_tiny_llama_gguf,
)


def test_tiny_llama_values_follow_the_factory(tmp_path):
    path = write_tiny_llama_gguf(
        tmp_path / "t.gguf", n_embd=48, n_layer=3, n_head=6, n_head_kv=2, n_ff=96, n_ctx_train=512
    )
    info = read_gguf_metadata(path)
    assert (info.architecture, info.name, info.quant, info.file_type) == ("llama", "tiny-llama", "F32", 0)
    assert (info.block_count, info.embedding_length, info.head_count, info.head_count_kv) == (3, 48, 6, 2)
    assert (info.context_length, info.feed_forward_length) == (512, 96)
    assert info.tensor_count == 3 + 9 * 3
    assert info.size_bytes == path.stat().st_size
    assert info.bos_token_id == 1 and info.eos_token_id == 2
    assert "<|im_start|>" in info.chat_template
    vocab = info.vocab_size
    head_dim, kv_dim = 48 // 6, 48 // 6 * 2
    per_layer = 2 * 48 + 2 * 48 * 48 + 2 * kv_dim * 48 + 3 * 96 * 48
    assert head_dim == 8
    assert info.n_params == 2 * vocab * 48 + 48 + 3 * per_layer
    assert info.tensor_types == {"F32": info.tensor_count}


def test_agrees_with_the_gguf_package_reader(tiny_gguf):
    from gguf import GGUFReader

    info = read_gguf_metadata(tiny_gguf)
    ref = GGUFReader(tiny_gguf)
    assert info.data_offset == ref.data_offset and info.alignment == ref.alignment
    assert [(t.name, t.n_elements, t.n_bytes, t.offset + info.data_offset) for t in info.tensors] == [
        (t.name, t.n_elements, t.n_bytes, t.data_offset) for t in ref.tensors
    ]
    assert info.vocab_size == len(ref.fields["tokenizer.ggml.tokens"].data)
    assert info.chat_template == ref.fields["tokenizer.chat_template"].contents()
    for key, value in info.scalars.items():
        expected = ref.fields[key].contents()
        assert value == pytest.approx(expected) if isinstance(value, float) else value == expected, key


def test_no_template_and_json_form(tiny_gguf_no_template):
    import json

    info = read_gguf_metadata(tiny_gguf_no_template)
    assert info.chat_template is None
    d = json.loads(json.dumps(info.as_dict()))
    assert "tensors" not in d and d["architecture"] == "llama"
    assert "tokenizer.ggml.tokens" not in d["scalars"]


def test_per_layer_kv_heads_keep_max_and_list(tmp_path):
    layers = [8, 2, 2, 4, 0]
    path = write_meta_only_gguf(
        tmp_path / "m.gguf",
        {"general.architecture": "hybrid", "hybrid.block_count": 5, "hybrid.attention.head_count_kv": layers},
    )
    info = read_gguf_metadata(path)
    assert info.head_count_kv == max(layers)
    assert info.head_count_kv_per_layer == tuple(layers)
    assert info.as_dict()["head_count_kv_per_layer"] == layers


def test_quant_label_from_file_type_and_inferred():
    from gguf import LlamaFileType

    assert quant_label(int(LlamaFileType.MOSTLY_Q4_K_M)) == "Q4_K_M"
    assert quant_label(int(LlamaFileType.MOSTLY_Q8_0)) == "Q8_0"
    assert quant_label(int(LlamaFileType.MOSTLY_BF16)) == "BF16"
    assert quant_label(None) is None


def test_quant_inferred_from_tensor_types_without_file_type(tmp_path):
    # a Q8_0 matrix (block 32, 34 bytes) outweighs an F32 vector
    raw = RawGGUF(tensors=[("w", (64, 4), 8, 0), ("n", (4,), 0, 288)])
    info = read_gguf_metadata(raw.write(tmp_path / "q.gguf"))
    assert info.file_type is None and info.quant == "Q8_0"
    assert info.tensors[0].n_bytes == 64 * 4 // 32 * 34


def test_big_endian_file_is_read(tmp_path):
    from gguf import GGUFEndian, GGUFWriter

    path = tmp_path / "be.gguf"
    w = GGUFWriter(str(path), arch="llama", endianess=GGUFEndian.BIG)
    w.add_block_count(7)
    w.add_tensor("x", np.arange(16, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    info = read_gguf_metadata(path)
    assert info.byte_order == "big" and info.block_count == 7 and info.tensors[0].n_elements == 16


def test_raw_builder_default_is_valid(tmp_path):
    """The base every must-fail case mutates is itself accepted, so each failure below is
    caused by its one change."""
    info = read_gguf_metadata(RawGGUF().write(tmp_path / "ok.gguf"))
    assert info.architecture == "llama" and info.tensor_count == 1


def _expect_invalid(path: Path, *words: str) -> InvalidModelFile:
    with pytest.raises(InvalidModelFile) as ei:
        read_gguf_metadata(path)
    msg = str(ei.value)
    assert str(path) in msg
    for word in words:
        assert word in msg, (word, msg)
    assert "internal error" not in msg
    return ei.value


BAD = {
    # name: (builder, words expected in the message)
    "bad magic": (lambda: RawGGUF(magic=b"GGML"), ["not a GGUF file", "bad magic"]),
    "version 0": (lambda: RawGGUF(version=0), ["unsupported GGUF version 0"]),
    "version 1": (lambda: RawGGUF(version=1), ["version 1"]),
    "version 4": (lambda: RawGGUF(version=4), ["unsupported GGUF version"]),
    "version max": (lambda: RawGGUF(version=0xFFFFFFFF), ["unsupported GGUF version"]),
    "n_tensors 2^64-1": (lambda: RawGGUF(tensor_count=2**64 - 1), ["tensor count"]),
    "n_tensors 2^63": (lambda: RawGGUF(tensor_count=2**63), ["tensor count"]),
    "n_tensors one too many": (lambda: RawGGUF(tensor_count=2), ["truncated"]),
    "n_kv 2^64-1": (lambda: RawGGUF(kv_count=2**64 - 1), ["metadata count"]),
    "key length past EOF": (lambda: RawGGUF(kvs=[(Raw(struct.pack("<Q", 900) + b"k"), U8, 1, None)]), ["truncated"]),
    "key length huge": (lambda: RawGGUF(kvs=[(Raw(struct.pack("<Q", 2**64 - 1) + b"k"), U8, 1, None)]), ["claims"]),
    "empty key": (lambda: RawGGUF(kvs=[("", U32, 1, None)]), ["empty"]),
    "duplicate key": (
        lambda: RawGGUF(kvs=[("a.b", U32, 1, None), ("a.b", U32, 2, None)]),
        ["duplicate metadata key 'a.b'"],
    ),
    "bad value type": (lambda: RawGGUF(kvs=[("a.b", 13, Raw(bytes(4)), None)]), ["invalid value type 13"]),
    "bad value type max": (lambda: RawGGUF(kvs=[("a.b", 0xFFFFFFFF, Raw(bytes(4)), None)]), ["invalid value type"]),
    "bad array element type": (lambda: RawGGUF(kvs=[("a.b", ARRAY, [], 77)]), ["invalid element type 77"]),
    "nested array": (lambda: RawGGUF(kvs=[("a.b", ARRAY, [], ARRAY)]), ["nested array"]),
    "array count huge": (
        lambda: RawGGUF(kvs=[("a.b", ARRAY, Raw(struct.pack("<IQ", U32, 2**64 - 1)), None)]),
        ["elements"],
    ),
    "array past EOF": (
        lambda: RawGGUF(kvs=[("a.b", ARRAY, Raw(struct.pack("<IQ", U32, 10**6)), None)]),
        ["more than the file"],
    ),
    "string array count huge": (
        lambda: RawGGUF(kvs=[("a.b", ARRAY, Raw(struct.pack("<IQ", STRING, 2**40)), None)]),
        ["elements"],
    ),
    "string array more than file": (
        lambda: RawGGUF(kvs=[("a.b", ARRAY, Raw(struct.pack("<IQ", STRING, 10**6)), None)]),
        ["strings, more than the file can hold"],
    ),
    "string in array past EOF": (
        lambda: RawGGUF(kvs=[("a.b", ARRAY, Raw(struct.pack("<IQQ", STRING, 100, 2**62)), None)], data=bytes(2048)),
        ["past the end"],
    ),
    "string length huge": (
        lambda: RawGGUF(kvs=[("a.b", STRING, Raw(struct.pack("<Q", 2**64 - 1) + b"x"), None)]),
        ["claims"],
    ),
    "string length past EOF": (
        lambda: RawGGUF(kvs=[("a.b", STRING, Raw(struct.pack("<Q", 10**6) + b"x"), None)]),
        ["truncated"],
    ),
    "alignment zero": (lambda: RawGGUF(kvs=[("general.alignment", U32, 0, None)]), ["alignment 0"]),
    "alignment not pow2": (lambda: RawGGUF(kvs=[("general.alignment", U32, 48, None)], alignment=48), ["alignment 48"]),
    "alignment huge": (lambda: RawGGUF(kvs=[("general.alignment", U32, 2**31, None)], alignment=32), ["alignment"]),
    "alignment wrong type": (lambda: RawGGUF(kvs=[("general.alignment", U64, 32, None)]), ["UINT32"]),
    "offset wrap": (lambda: RawGGUF(tensors=[("t", (8,), 0, 2**64 - 64)], data=bytes(64)), ["past the end"]),
    "offset misaligned": (
        lambda: RawGGUF(tensors=[("t", (8,), 0, 4)], data=bytes(64)),
        ["not a multiple of the alignment"],
    ),
    "shape overflow": (lambda: RawGGUF(tensors=[("t", (2**32, 2**32, 2**32), 0, 0)], data=bytes(64)), ["overflows"]),
    "dim over int64": (lambda: RawGGUF(tensors=[("t", (2**63,), 0, 0)], data=bytes(64)), ["overflows"]),
    "n_dims zero": (lambda: RawGGUF(tensors=[("t", (), 0, 0)], data=bytes(64)), ["0 dimensions"]),
    "n_dims five": (lambda: RawGGUF(tensors=[("t", (1, 1, 1, 1, 8), 0, 0)], data=bytes(64)), ["5 dimensions"]),
    "data past EOF": (lambda: RawGGUF(tensors=[("t", (1024,), 0, 0)], data=bytes(64)), ["past the end"]),
    "unknown ggml type": (lambda: RawGGUF(tensors=[("t", (8,), 4, 0)], data=bytes(64)), ["unknown ggml type 4"]),
    "row not block multiple": (lambda: RawGGUF(tensors=[("t", (33,), 8, 0)], data=bytes(64)), ["block size"]),
    "duplicate tensor": (lambda: RawGGUF(tensors=[("t", (8,), 0, 0), ("t", (8,), 0, 32)]), ["'t' is a duplicate"]),
    "empty tensor name": (lambda: RawGGUF(tensors=[("", (8,), 0, 0)]), ["empty name"]),
    "tensor name too long": (lambda: RawGGUF(tensors=[("x" * 64, (8,), 0, 0)]), ["claims 64 bytes"]),
    "overlapping tensors": (lambda: RawGGUF(tensors=[("a", (16,), 0, 0), ("b", (16,), 0, 32)]), ["overlaps"]),
    "arch key wrong type": (lambda: RawGGUF(kvs=[("general.architecture", U32, 1, None)]), ["expected a string"]),
    "negative layer count": (
        lambda: RawGGUF(kvs=[("general.architecture", STRING, "llama", None), ("llama.block_count", I32, -1, None)]),
        ["negative"],
    ),
    "float context length": (
        lambda: RawGGUF(
            kvs=[("general.architecture", STRING, "llama", None), ("llama.context_length", F32, 1.5, None)]
        ),
        ["expected an integer"],
    ),
    "key not utf-8": (lambda: RawGGUF(kvs=[(b"\xff\xfe", U32, 1, None)]), ["UTF-8"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_must_fail_cases(case, tmp_path):
    build, words = BAD[case]
    path = build().write(tmp_path / "bad.gguf")
    t0 = time.perf_counter()
    _expect_invalid(path, *words)
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("cut", [0, 3, 4, 10, 23, 24, 40, 200, 1000, -100, -1])
def test_truncated_files(tiny_gguf, tmp_path, cut):
    data = tiny_gguf.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut] if cut >= 0 else data[: len(data) + cut])
    err = _expect_invalid(path)
    assert any(w in err.message for w in ("truncated", "past the end", "empty", "more than the file can hold"))


def test_not_a_gguf_text_file(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("this is not a model\n" * 10)
    _expect_invalid(path, "not a GGUF file", "bad magic")


def test_not_a_regular_file(tmp_path):
    _expect_invalid(tmp_path, "not a regular file")
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    _expect_invalid(fifo, "not a regular file")  # and it did not block waiting for a writer
    assert time.perf_counter() - t0 < 2.0
    _expect_invalid(tmp_path / "missing.gguf", "no such file")


def test_open_gguf_reader_refuses_what_the_package_alone_would_open(tmp_path, tiny_gguf):
    assert len(open_gguf_reader(tiny_gguf).tensors) == read_gguf_metadata(tiny_gguf).tensor_count
    wrap = RawGGUF(tensors=[("t", (8,), 0, 2**64 - 64)], data=bytes(64)).write(tmp_path / "wrap.gguf")
    with pytest.raises(InvalidModelFile, match="past the end"):
        open_gguf_reader(wrap)


def test_many_strings_walk_fast_and_too_many_refused(tmp_path):
    n = gguf_walk.MAX_TOTAL_ARRAY_STRINGS
    head = RawGGUF(kvs=[("tokenizer.ggml.tokens", ARRAY, [], STRING)], tensors=[])
    ok = bytearray(head.to_bytes())
    count_at = 24 + 8 + len("tokenizer.ggml.tokens") + 4 + 4
    ok[count_at : count_at + 8] = struct.pack("<Q", n)
    path = tmp_path / "strings.gguf"
    path.write_bytes(bytes(ok) + bytes(8 * n))
    t0 = time.perf_counter()
    info = read_gguf_metadata(path)
    assert time.perf_counter() - t0 < 2.0
    assert info.vocab_size == n
    ok[count_at : count_at + 8] = struct.pack("<Q", n + 1)
    path.write_bytes(bytes(ok) + bytes(8 * (n + 1)))
    _expect_invalid(path, "strings")


@pytest.mark.gemma
def test_real_gemma_file(gemma_gguf):
    t0 = time.perf_counter()
    info = read_gguf_metadata(gemma_gguf)
    assert time.perf_counter() - t0 < 2.0
    assert info.architecture == "gemma3"
    assert info.quant == "Q4_K_M" and info.file_type == 15
    assert info.context_length == 32768 and info.block_count == 18 and info.embedding_length == 640
    assert info.head_count == 4 and info.head_count_kv == 1 and info.key_length == info.value_length == 256
    assert info.vocab_size == 262144 and info.sliding_window == 512
    assert abs(info.n_params - 270e6) / 270e6 < 0.05
    assert info.chat_template is None  # this build of the file ships without one
    assert info.bos_token_id == 2 and info.eos_token_id == 1
    assert info.tensor_types.get("Q4_K", 0) > 0
    last = max(info.tensors, key=lambda t: t.offset)
    assert info.data_offset + last.offset + last.n_bytes <= info.size_bytes


@pytest.mark.gemma
def test_real_gemma_header_without_its_data(gemma_gguf, tmp_path):
    info = read_gguf_metadata(gemma_gguf)
    with open(gemma_gguf, "rb") as f:
        head = f.read(info.data_offset + 4096)
    path = tmp_path / "gemma-head.gguf"
    path.write_bytes(head)
    _expect_invalid(path, "past the end")


def _header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


@pytest.mark.slow
def test_worst_case_counts_stay_under_two_seconds(tmp_path):
    """The caps are what keep the walk bounded: the most kvs (each a string array) and the
    most tensors the limits allow are still walked in under 2 s."""
    n_kv = gguf_walk.MAX_KV_COUNT
    parts = [_header(0, n_kv)]
    for i in range(n_kv):
        key = f"k{i}".encode()
        parts.append(struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", ARRAY, STRING, 32) + bytes(8 * 32))
    kvs = tmp_path / "kvs.gguf"
    kvs.write_bytes(b"".join(parts))
    n_t = gguf_walk.MAX_TENSOR_COUNT
    parts = [_header(n_t, 0)]
    for i in range(n_t):
        name = f"t{i}".encode()
        parts.append(struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, 0, 0, 0))  # empty F32 tensors
    data = b"".join(parts)
    tensors = tmp_path / "tensors.gguf"
    tensors.write_bytes(data + bytes(-len(data) % 32))
    for path, attr, n in ((kvs, "kv_count", n_kv), (tensors, "tensor_count", n_t)):
        t0 = time.perf_counter()
        info = read_gguf_metadata(path)
        assert time.perf_counter() - t0 < 2.0
        assert getattr(info, attr) == n
    over = bytearray(tensors.read_bytes())
    over[8:16] = struct.pack("<Q", n_t + 1)
    tensors.write_bytes(bytes(over) + bytes(64))
    _expect_invalid(tensors, "tensor count")
