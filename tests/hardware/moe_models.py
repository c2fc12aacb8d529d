"""Metadata-only GGUFs of real MoE and dense models for the placement tests, and a tiny runnable MoE.

:func:`write_sized_gguf` writes a real GGUF header (metadata and every tensor's name, type and
shape as the published file has them) and extends the file to its full length without writing
the data: a sparse file that takes no disk, that localrun's own GGUF reader indexes like the real
download, and whose ``expert_bytes`` come from its tensors. The shapes are those of Qwen3-30B-A3B
(qwen3moe: 128 experts, ``blk.N.ffn_{gate,up,down}_exps``), Qwen1.5-MoE-A2.7B (qwen2moe: 60
experts plus shared ones, ``ffn_*_shexp``) and Llama 3.1 8B (dense).

:func:`write_tiny_moe_gguf` writes a loadable qwen3moe with random weights (a few hundred KB)
for the CPU run through tensor overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from localrun.types import FileEntry, Format, ModelRecord
from tests.factories import _tiny_vocab, add_tiny_tokenizer


def _nbytes(shape: tuple[int, ...], qtype) -> int:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape))
    return n // block * size


def write_sized_gguf(
    path: Path, arch: str, kv: dict[str, Any], tensors: list[tuple[str, tuple[int, ...], Any]]
) -> Path:
    """A GGUF whose header is real and whose data is a hole (see the module docstring).

    ``tensors``: (name, shape in ggml order — ne[0] first —, GGMLQuantizationType)."""
    from gguf import GGUFWriter

    from tests.factories import _add_typed

    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), arch=arch)
    for key, value in kv.items():
        _add_typed(w, key, value)
    total = 0
    for name, ne, qtype in tensors:
        nbytes = _nbytes(ne, qtype)
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nbytes, raw_dtype=qtype)
        total += GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.flush()
    header = w.fout[0].tell()
    w.close()
    with open(path, "r+b") as f:
        f.truncate(GGUFWriter.ggml_pad(header, w.data_alignment) + total)
    return path


def _attention(i: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, q, *, norms: bool) -> list:
    from gguf import GGMLQuantizationType as T

    out = [
        (f"blk.{i}.attn_norm.weight", (n_embd,), T.F32),
        (f"blk.{i}.attn_q.weight", (n_embd, n_head * head_dim), q),
        (f"blk.{i}.attn_k.weight", (n_embd, n_head_kv * head_dim), q),
        (f"blk.{i}.attn_v.weight", (n_embd, n_head_kv * head_dim), q),
        (f"blk.{i}.attn_output.weight", (n_head * head_dim, n_embd), q),
        (f"blk.{i}.ffn_norm.weight", (n_embd,), T.F32),
    ]
    if norms:
        out += [
            (f"blk.{i}.attn_q_norm.weight", (head_dim,), T.F32),
            (f"blk.{i}.attn_k_norm.weight", (head_dim,), T.F32),
        ]
    return out


def _common(arch: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, ctx: int, vocab: int) -> dict:
    return {
        f"{arch}.block_count": n_layer,
        f"{arch}.context_length": ctx,
        f"{arch}.embedding_length": n_embd,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.layer_norm_rms_eps": 1e-6,
        f"{arch}.vocab_size": vocab,
        "general.file_type": 15,  # MOSTLY_Q4_K_M
    }


def qwen3_30b_a3b(path: Path) -> Path:
    """Qwen3-30B-A3B Q4_K_M's layout: 48 layers, 128 experts (8 used) of 768, GQA 32/4 × 128."""
    from gguf import GGMLQuantizationType as T

    arch, L, E, D, F, V = "qwen3moe", 48, 128, 2048, 768, 151936
    kv = _common(arch, L, D, 32, 4, 40960, V) | {
        f"{arch}.attention.key_length": 128,
        f"{arch}.attention.value_length": 128,
        f"{arch}.feed_forward_length": 6144,
        f"{arch}.expert_count": E,
        f"{arch}.expert_used_count": 8,
        f"{arch}.expert_feed_forward_length": F,
    }
    tensors = [
        ("token_embd.weight", (D, V), T.Q4_K),
        ("output_norm.weight", (D,), T.F32),
        ("output.weight", (D, V), T.Q6_K),
    ]
    for i in range(L):
        tensors += _attention(i, D, 32, 4, 128, T.Q4_K, norms=True)
        tensors += [
            (f"blk.{i}.ffn_gate_inp.weight", (D, E), T.F32),
            (f"blk.{i}.ffn_gate_exps.weight", (D, F, E), T.Q4_K),
            (f"blk.{i}.ffn_up_exps.weight", (D, F, E), T.Q4_K),
            (f"blk.{i}.ffn_down_exps.weight", (F, D, E), T.Q6_K),
        ]
    return write_sized_gguf(path, arch, kv, tensors)


def qwen15_moe_a27b(path: Path) -> Path:
    """Qwen1.5-MoE-A2.7B Q4_K_M's layout: 24 layers, 60 experts of 1408 and a shared expert of 5632."""
    from gguf import GGMLQuantizationType as T

    arch, L, E, D, F, S, V = "qwen2moe", 24, 60, 2048, 1408, 5632, 151936
    kv = _common(arch, L, D, 16, 16, 8192, V) | {
        f"{arch}.feed_forward_length": 5632,
        f"{arch}.expert_count": E,
        f"{arch}.expert_used_count": 4,
        f"{arch}.expert_feed_forward_length": F,
        f"{arch}.expert_shared_feed_forward_length": S,
    }
    tensors = [
        ("token_embd.weight", (D, V), T.Q4_K),
        ("output_norm.weight", (D,), T.F32),
        ("output.weight", (D, V), T.Q6_K),
    ]
    for i in range(L):
        tensors += _attention(i, D, 16, 16, 128, T.Q4_K, norms=False)
        tensors += [
            (f"blk.{i}.ffn_gate_inp.weight", (D, E), T.F32),
            (f"blk.{i}.ffn_gate_exps.weight", (D, F, E), T.Q4_K),
            (f"blk.{i}.ffn_up_exps.weight", (D, F, E), T.Q4_K),
            (f"blk.{i}.ffn_down_exps.weight", (F, D, E), T.Q8_0),
            (f"blk.{i}.ffn_gate_inp_shexp.weight", (D,), T.F32),
            (f"blk.{i}.ffn_gate_shexp.weight", (D, S), T.Q4_K),
            (f"blk.{i}.ffn_up_shexp.weight", (D, S), T.Q4_K),
            (f"blk.{i}.ffn_down_shexp.weight", (S, D), T.Q6_K),
        ]
    return write_sized_gguf(path, arch, kv, tensors)


def llama31_8b(path: Path) -> Path:
    """Llama 3.1 8B Q4_K_M's layout: 32 dense layers, GQA 32/8 × 128, 14336 FFN."""
    from gguf import GGMLQuantizationType as T

    arch, L, D, F, V = "llama", 32, 4096, 14336, 128256
    kv = _common(arch, L, D, 32, 8, 131072, V) | {f"{arch}.feed_forward_length": F}
    tensors = [
        ("token_embd.weight", (D, V), T.Q4_K),
        ("output_norm.weight", (D,), T.F32),
        ("output.weight", (D, V), T.Q6_K),
    ]
    for i in range(L):
        tensors += _attention(i, D, 32, 8, 128, T.Q4_K, norms=False)
        tensors += [
            (f"blk.{i}.ffn_gate.weight", (D, F), T.Q4_K),
            (f"blk.{i}.ffn_up.weight", (D, F), T.Q4_K),
            (f"blk.{i}.ffn_down.weight", (F, D), T.Q6_K),
        ]
    return write_sized_gguf(path, arch, kv, tensors)


def indexed(path: Path, name: str) -> ModelRecord:
    """The record ``localrun import`` would index for ``path``: its GGUF metadata as the store keeps it."""
    from localrun.modelstore.gguf_meta import read_gguf_metadata

    info = read_gguf_metadata(path)
    return ModelRecord(
        name=name,
        format=Format.GGUF,
        path=str(path),
        files=(FileEntry(str(path), info.size_bytes),),
        metadata=info.as_dict(),
    )


def tensor_names(path: Path) -> list[str]:
    from localrun.modelstore.gguf_meta import read_gguf_metadata

    return [t.name for t in read_gguf_metadata(path).tensors]


def write_tiny_moe_gguf(
    path: Path, *, n_layer: int = 2, n_embd: int = 64, n_expert: int = 4, n_ff_exp: int = 32
) -> Path:
    """A loadable qwen3moe with random F32 weights: 4 experts, 2 used, per-head q/k norms."""
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    n_head, n_head_kv = 4, 2
    head_dim = n_embd // n_head
    tokens, scores, types = _tiny_vocab()
    rng = np.random.default_rng(7)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = GGUFWriter(str(path), arch="qwen3moe")
    w.add_name("tiny-moe")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff_exp * 2)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(n_ff_exp)
    add_tiny_tokenizer(w, tokens, scores, types)
    w.add_tensor("token_embd.weight", weight(len(tokens), n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", weight(len(tokens), n_embd))
    for i in range(n_layer):  # numpy shapes are ggml's ne reversed
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", weight(n_head * head_dim, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_head * head_dim))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", weight(n_expert, n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", weight(n_expert, n_ff_exp, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", weight(n_expert, n_ff_exp, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", weight(n_expert, n_embd, n_ff_exp))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
