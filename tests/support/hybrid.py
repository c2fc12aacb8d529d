"""Tiny random GGUFs of a hybrid architecture (LFM2: short-convolution layers beside attention
layers) and a pure recurrent one (Mamba2), written with the ``gguf`` package's writer.

Neither state can be cut back to an arbitrary prefix (``llama_memory_seq_rm`` refuses a partial
range), which is what the prefix cache's checkpoints (runtimes/llamacpp/cache/checkpoints.py) are for.
Tensor names and shapes follow llama.cpp's loaders (src/models/lfm2.cpp, mamba2.cpp; numpy shapes
are the reverse of ggml's ``ne``); the vocabulary and chat template are the tiny llama's
(tests/factories.py), so prompts tokenize and render the same way. Built once into the test cache
(``~/.cache/localrun-test/hybrid``), keyed by a version in the name, never committed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tests.factories import DEFAULT_TINY_TEMPLATE, _tiny_vocab, add_tiny_tokenizer

HYBRID_DIR = Path(os.environ.get("LOCALRUN_TEST_CACHE", Path.home() / ".cache" / "localrun-test")) / "hybrid"
#: Bump when a writer changes, so a cached file from an older writer is not reused.
VERSION = 2


def _writer(path: Path, arch: str, name: str, *, n_embd: int, n_layer: int, n_ctx_train: int):
    from gguf import GGUFWriter

    tokens, scores, types = _tiny_vocab()
    w = GGUFWriter(str(path), arch=arch)
    w.add_name(name)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_layer_norm_rms_eps(1e-5)
    add_tiny_tokenizer(w, tokens, scores, types)
    w.add_add_eos_token(False)
    w.add_chat_template(DEFAULT_TINY_TEMPLATE)
    return w, len(tokens)


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_lfm2_gguf(
    path: str | Path, *, n_embd: int = 64, n_head: int = 4, n_ff: int = 128, l_cache: int = 3, seed: int = 0
) -> Path:
    """LFM2 with four layers, convolution / attention alternating (``head_count_kv`` 0 marks a
    convolution layer), random F32 weights: llama.cpp runs it as a hybrid memory (KV cache for
    the attention layers, a recurrent cache for the convolution states)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kinds = ["conv", "attn", "conv", "attn"]
    head_dim = n_embd // n_head
    w, n_vocab = _writer(path, "lfm2", "tiny-lfm2", n_embd=n_embd, n_layer=len(kinds), n_ctx_train=32768)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv([n_head if k == "attn" else 0 for k in kinds])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_shortconv_l_cache(l_cache)
    rng = np.random.default_rng(seed)

    def weight(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731 - a norm's weight
    w.add_tensor("token_embd.weight", weight(n_vocab, n_embd, scale=1.0))
    w.add_tensor("token_embd_norm.weight", ones(n_embd))
    w.add_tensor("output.weight", weight(n_vocab, n_embd, scale=0.5))
    for i, kind in enumerate(kinds):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd, scale=0.1))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd, scale=0.1))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff, scale=0.1))
        if kind == "attn":
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", ones(head_dim))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", ones(head_dim))
            w.add_tensor(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd, scale=0.3))
            w.add_tensor(f"blk.{i}.attn_k.weight", weight(n_embd, n_embd, scale=0.3))
            w.add_tensor(f"blk.{i}.attn_v.weight", weight(n_embd, n_embd, scale=0.2))
            w.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd, scale=0.2))
        else:
            w.add_tensor(f"blk.{i}.shortconv.conv.weight", weight(n_embd, l_cache, scale=0.5))
            w.add_tensor(f"blk.{i}.shortconv.in_proj.weight", weight(3 * n_embd, n_embd, scale=0.2))
            w.add_tensor(f"blk.{i}.shortconv.out_proj.weight", weight(n_embd, n_embd, scale=0.2))
    _finish(w)
    return path


def write_mamba2_gguf(
    path: str | Path,
    *,
    n_embd: int = 64,
    n_layer: int = 2,
    d_inner: int = 128,
    d_state: int = 16,
    n_heads: int = 4,
    d_conv: int = 4,
    seed: int = 0,
) -> Path:
    """Mamba2 (pure recurrent: no KV cache at all), one group, random F32 weights."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w, n_vocab = _writer(path, "mamba2", "tiny-mamba2", n_embd=n_embd, n_layer=n_layer, n_ctx_train=1 << 20)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_heads)
    w.add_ssm_group_count(1)
    rng = np.random.default_rng(seed)

    def weight(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    conv_dim = d_inner + 2 * d_state
    w.add_tensor("token_embd.weight", weight(n_vocab, n_embd, scale=1.0))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", weight(n_vocab, n_embd, scale=0.5))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ssm_in.weight", weight(d_inner + conv_dim + n_heads, n_embd, scale=0.2))
        w.add_tensor(f"blk.{i}.ssm_conv1d.weight", weight(conv_dim, d_conv, scale=0.5))
        w.add_tensor(f"blk.{i}.ssm_conv1d.bias", weight(conv_dim, scale=0.1))
        w.add_tensor(f"blk.{i}.ssm_dt.bias", weight(n_heads, scale=0.5))
        # A = -exp(A_log) < 0, so the state decays (what a trained Mamba2 holds; the converter writes it so).
        w.add_tensor(f"blk.{i}.ssm_a", -np.exp(weight(n_heads, 1, scale=0.5)))
        w.add_tensor(f"blk.{i}.ssm_d", np.ones((n_heads, 1), dtype=np.float32))
        w.add_tensor(f"blk.{i}.ssm_norm.weight", np.ones((1, d_inner), dtype=np.float32))
        w.add_tensor(f"blk.{i}.ssm_out.weight", weight(n_embd, d_inner, scale=0.2))
    _finish(w)
    return path


def _cached(name: str, write) -> Path:
    path = HYBRID_DIR / f"{name}-v{VERSION}.gguf"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.partial")
        write(tmp)
        os.replace(tmp, path)  # two test processes building at once both end with a whole file
    return path


def lfm2_path() -> Path:
    return _cached("tiny-lfm2", write_lfm2_gguf)


def mamba2_path() -> Path:
    return _cached("tiny-mamba2", write_mamba2_gguf)
