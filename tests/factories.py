"""Test model factory: every GGUF a test needs is made here, on the fly, from nothing.

Three kinds of file:

* :func:`write_tiny_llama_gguf` — a real, loadable llama-architecture model (random F32
  weights, an SPM vocabulary with byte fallback) that llama-cpp-python can run. ~0.5 MB.
* :func:`write_meta_only_gguf` — a well-formed file with chosen metadata and one tiny
  tensor, for parser tests that care about keys, not weights.
* :class:`RawGGUF` — a byte-level builder that writes whatever it is told, including what
  no honest writer would (empty keys, duplicate keys, bad types, wrapping offsets), for the
  must-fail cases; plus :func:`mutate` for seeded fuzzing.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_TINY_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A ChatML-like template: simple, sandbox-safe, and recognisable in rendered prompts."""

_WORDS = (
    "hello world the a an is of to and in it you that he was for on are with as I his they "
    "be at one have this from or had by hot word but what some we can out other were all "
    "there when up use your how said each she which do their time if will way about many"
).split()


def _tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """An SPM vocabulary: specials, 256 byte tokens (byte fallback makes any text encodable),
    single letters and a few words, so llama.cpp's tokenizer has something to merge."""
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(TokenType.BYTE)
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    for word in _WORDS:  # every prefix, so SPM's pairwise merges can grow "▁h" into "▁hello"
        for end in range(1, len(word) + 1):
            if "\u2581" + word[:end] not in pieces:
                pieces.append("\u2581" + word[:end])
    for piece in pieces:
        tokens.append(piece)
        types.append(TokenType.NORMAL)
    # SPM merges by score: longer pieces score higher so "hello" beats h+e+l+l+o.
    scores = [0.0 if t != TokenType.NORMAL else -10.0 + len(tok) for tok, t in zip(tokens, types)]
    return tokens, scores, [int(t) for t in types]


def add_tiny_tokenizer(w, tokens: list, scores: list, types: list) -> None:
    """The tiny vocabulary's tokenizer keys (llama SPM, BOS 1, EOS 2, UNK 0, BOS added), and the
    F32 file type, on a ``GGUFWriter``: every random-weight fixture of tests/ writes these."""
    from gguf import LlamaFileType

    w.add_vocab_size(len(tokens))
    w.add_file_type(LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)


def write_tiny_llama_gguf(
    path: str | Path,
    *,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 4,
    n_ff: int = 128,
    n_ctx_train: int = 256,
    chat_template: str | None = DEFAULT_TINY_TEMPLATE,
    seed: int = 0,
    name: str = "tiny-llama",
    split_max_tensors: int = 0,
    extra_tokens: tuple[str, ...] = (),
    extra_kv: dict[str, Any] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    arch: str = "llama",
) -> Path:
    """Write a loadable llama GGUF with random F32 weights and return its path.

    Shapes follow llama.cpp's llama loader; numpy shapes are the reverse of ggml's ``ne``.
    With ``split_max_tensors`` the model is split into ``<stem>-0000k-of-0000N.gguf`` shards
    (metadata in the first) and the first shard's path is returned. ``extra_tokens`` are
    control tokens appended to the vocabulary (ids from its old end: FIM tokens, say),
    ``extra_kv`` more metadata (``tokenizer.ggml.fim_pre_token_id``, ``llama.pooling_type``…)
    and ``extra_tensors`` more weights (a classification head). ``arch="qwen3"`` writes the
    same model as Qwen3 (per-head q/k norms), whose loader takes a rank head (``cls.output``).
    """
    from gguf import GGUFWriter

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv
    tokens, scores, types = _tiny_vocab()
    from gguf import TokenType

    for extra in extra_tokens:
        tokens.append(extra)
        scores.append(0.0)
        types.append(int(TokenType.CONTROL))
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = GGUFWriter(str(path), arch=arch, split_max_tensors=split_max_tensors)
    w.add_name(name)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    add_tiny_tokenizer(w, tokens, scores, types)
    w.add_add_eos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for key, value in (extra_kv or {}).items():
        _add_typed(w, key, value)

    w.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", weight(n_vocab, n_embd))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", weight(n_embd_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", weight(n_embd_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        if arch == "qwen3":
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    for tensor_name, arr in (extra_tensors or {}).items():
        w.add_tensor(tensor_name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shards = w.format_shard_names(path)
    return shards[0]


def _add_typed(w: Any, key: str, value: Any) -> None:
    """Pick the GGUF type a test most likely means for a Python value."""
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        if 0 <= value < 2**32:
            w.add_uint32(key, value)
        elif value < 0 and value >= -(2**63):
            w.add_int64(key, value)
        else:
            w.add_uint64(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        w.add_array(key, list(value))
    else:
        raise TypeError(f"no GGUF type for {type(value).__name__} ({key})")


def write_meta_only_gguf(
    path: str | Path,
    kv: dict[str, Any],
    tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write a well-formed GGUF with the given metadata and (by default) one 8-float tensor.

    ``general.architecture`` defaults to ``llama``. Ints become UINT32 (INT64/UINT64 when
    out of range), floats FLOAT32, lists arrays of the first element's type.
    """
    from gguf import GGUFWriter

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kv = dict(kv)
    w = GGUFWriter(str(path), arch=str(kv.pop("general.architecture", "llama")))
    for key, value in kv.items():
        _add_typed(w, key, value)
    if tensors is None:
        tensors = {"dummy.weight": np.arange(8, dtype=np.float32)}
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --- raw byte builder for files no honest writer would produce -------------------------

# GGUF value types (ggml docs/gguf.md)
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR_FMT = {
    U8: "B",
    I8: "b",
    U16: "H",
    I16: "h",
    U32: "I",
    I32: "i",
    F32: "f",
    BOOL: "?",
    U64: "Q",
    I64: "q",
    F64: "d",
}


class Raw(bytes):
    """Bytes emitted verbatim in place of an encoded key or value, to lie about a length."""


def gguf_string(s: str | bytes, *, length: int | None = None) -> bytes:
    """A GGUF string; ``length`` overrides the declared length to lie about it."""
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if length is None else length) + b


def gguf_value(vtype: int, value: Any, *, sub_type: int | None = None) -> bytes:
    """The bytes of a value of type ``vtype`` (without the type tag)."""
    if isinstance(value, Raw):
        return bytes(value)
    if vtype == STRING:
        return gguf_string(value)
    if vtype == ARRAY:
        assert sub_type is not None
        return struct.pack("<IQ", sub_type, len(value)) + b"".join(gguf_value(sub_type, v) for v in value)
    return struct.pack("<" + _SCALAR_FMT[vtype], value)


@dataclass
class RawGGUF:
    """A GGUF assembled byte by byte. Defaults make a valid one-tensor file."""

    magic: bytes = b"GGUF"
    version: int = 3
    kvs: list[tuple[str | bytes, int, Any, int | None]] = field(
        default_factory=lambda: [("general.architecture", STRING, "llama", None)]
    )
    tensors: list[tuple[str, tuple[int, ...], int, int]] = field(default_factory=lambda: [("t.weight", (8,), 0, 0)])
    """(name, ne, ggml_type, offset)"""
    alignment: int = 32
    data: bytes | None = None
    """Tensor data; default: zeros enough for every tensor."""
    tensor_count: int | None = None
    kv_count: int | None = None

    def header(self) -> bytes:
        out = bytearray(self.magic)
        out += struct.pack("<I", self.version)
        out += struct.pack("<Q", len(self.tensors) if self.tensor_count is None else self.tensor_count)
        out += struct.pack("<Q", len(self.kvs) if self.kv_count is None else self.kv_count)
        for key, vtype, value, sub_type in self.kvs:
            out += bytes(key) if isinstance(key, Raw) else gguf_string(key)
            out += struct.pack("<I", vtype)
            out += gguf_value(vtype, value, sub_type=sub_type)
        for name, ne, ttype, offset in self.tensors:
            out += gguf_string(name)
            out += struct.pack("<I", len(ne))
            out += b"".join(struct.pack("<Q", d) for d in ne)
            out += struct.pack("<IQ", ttype, offset)
        return bytes(out)

    def to_bytes(self) -> bytes:
        head = self.header()
        pad = (-len(head)) % self.alignment if self.alignment > 0 else 0
        data = self.data
        if data is None:
            from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

            end = 0
            for _, ne, ttype, offset in self.tensors:
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
                n = 1
                for d in ne:
                    n *= d
                end = max(end, offset + n // block * size)
            data = bytes(end)
        return head + bytes(pad) + data

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_bytes(self.to_bytes())
        return path


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One seeded random corruption: byte flips, a truncation, an insertion, a deletion, or
    an interesting integer (0, -1, 2^63, 2^64-64 …) stamped over 4 or 8 bytes."""
    buf = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0:  # flip a few bytes, biased towards the header where the parser lives
        for _ in range(rng.randint(1, 8)):
            limit = len(buf) if rng.random() < 0.2 else min(len(buf), 2048)
            i = rng.randrange(limit)
            buf[i] = rng.randrange(256)
    elif kind == 1:  # truncate
        del buf[rng.randrange(len(buf)) :]
    elif kind == 2:  # insert junk
        i = rng.randrange(len(buf) + 1)
        buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == 3:  # delete a span
        i = rng.randrange(len(buf))
        del buf[i : i + rng.randint(1, 16)]
    else:  # stamp an interesting integer
        width = 8 if kind == 4 else 4
        values = [0, 1, 2 ** (8 * width) - 1, 2 ** (8 * width - 1), 2 ** (8 * width) - 64, 0xFFFF, 3, 7, 64, 2**31]
        i = rng.randrange(max(1, min(len(buf), 4096) - width))
        buf[i : i + width] = rng.choice(values).to_bytes(width, "little")
    return bytes(buf)
