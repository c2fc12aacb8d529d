"""Builders for the repos the fake hub serves: real (tiny) GGUF files in several quants
and a split model, an MLX repo, an MLC repo, a gated repo. Everything is made on the fly."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import numpy as np

from tests.hub.fakehub import FakeHub

GGUF_REPO = "testorg/Tiny-GGUF"
SPLIT_REPO = "testorg/Big-GGUF"
MLX_REPO = "mlx-community/Tiny-4bit"
MLC_REPO = "mlc-ai/Tiny-q4f16_1-MLC"
GATED_REPO = "gatedorg/Secret-GGUF"
GATED_TOKEN = "hf_fake_token_for_tests"

#: llama.cpp's LlamaFileType values for the quants the fixtures use.
FILE_TYPES = {"F16": 1, "Q4_0": 2, "Q8_0": 7, "Q5_K_M": 17, "Q4_K_M": 15, "Q6_K": 18, "IQ4_XS": 30}


@functools.lru_cache(maxsize=64)
def make_gguf(
    *,
    quant: str = "Q4_K_M",
    name: str = "tiny",
    payload: int = 4096,
    seed: int = 0,
    split: tuple[int, int] | None = None,
) -> bytes:
    """A small valid GGUF: llama metadata plus one I8 tensor of ``payload`` random bytes.

    ``split=(index, count)`` writes the split.* keys the way gguf-split does (0-based index).
    """
    import gguf

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.gguf"
        w = gguf.GGUFWriter(str(path), arch="llama")
        w.add_name(name)
        w.add_file_type(FILE_TYPES.get(quant, 15))
        w.add_context_length(256)
        w.add_embedding_length(16)
        w.add_block_count(1)
        w.add_head_count(2)
        w.add_head_count_kv(2)
        w.add_feed_forward_length(32)
        if split is not None:
            w.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_NO, split[0])
            w.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_COUNT, split[1])
            w.add_int32(gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, split[1])
        w.add_tensor(f"blob.{split[0] if split else 0}", rng.integers(-128, 128, size=payload, dtype=np.int8))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


def gguf_repo_files() -> dict[str, bytes]:
    """Several quants, an mmproj and an imatrix that must never be picked, a README."""
    files = {
        f"Tiny-{q}.gguf": make_gguf(quant=q, seed=i) for i, q in enumerate(["Q4_0", "Q4_K_M", "Q5_K_M", "Q8_0", "F16"])
    }
    # In a folder of its own, so pulling the repo never pairs this llama-arch stand-in as a projector
    # (a sibling folder is not the model's, by llama.cpp's rule); it still must never be picked as the model.
    files["extras/mmproj-Tiny-F16.gguf"] = make_gguf(quant="F16", name="mmproj", seed=90)
    files["Tiny.imatrix.gguf"] = make_gguf(quant="F16", name="imatrix", seed=91)
    files["README.md"] = b"# Tiny GGUF\n"
    return files


def split_repo_files(parts: int = 3) -> dict[str, bytes]:
    """A split Q8_0 model in a subfolder plus a single-file Q4_0 (no Q4_K_M: default falls to Q8_0)."""
    files = {
        f"Q8_0/Big-Q8_0-{i + 1:05d}-of-{parts:05d}.gguf": make_gguf(quant="Q8_0", split=(i, parts), seed=10 + i)
        for i in range(parts)
    }
    files["Big-Q4_0.gguf"] = make_gguf(quant="Q4_0", seed=20)
    return files


def mlx_repo_files(*, config_extra: dict | None = None, extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    config = {
        "model_type": "llama",
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "quantization": {"group_size": 64, "bits": 4},
    }
    config.update(config_extra or {})
    files = {
        "config.json": json.dumps(config).encode(),
        "model-00001-of-00002.safetensors": _fake_safetensors(1),
        "model-00002-of-00002.safetensors": _fake_safetensors(2),
        "model.safetensors.index.json": json.dumps(
            {
                "metadata": {"total_size": 64},
                "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
            }
        ).encode(),
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
        "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
        "special_tokens_map.json": b"{}",
        "README.md": b"# MLX\n",
        "pytorch_model.bin": b"\x80\x04pickle-never-fetched",
    }
    files.update(extra or {})
    return files


def mlc_repo_files(*, legacy_cache_name: bool = False, extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    cache = "ndarray-cache.json" if legacy_cache_name else "tensor-cache.json"
    files = {
        "mlc-chat-config.json": json.dumps(
            {"model_type": "llama", "quantization": "q4f16_1", "context_window_size": 256}
        ).encode(),
        cache: json.dumps(
            {"records": [{"dataPath": "params_shard_0.bin"}, {"dataPath": "params_shard_1.bin"}]}
        ).encode(),
        "params_shard_0.bin": bytes(range(256)) * 8,
        "params_shard_1.bin": bytes(range(255, -1, -1)) * 8,
        "tokenizer.json": b'{"version": "1.0"}',
        "tokenizer_config.json": b"{}",
        "README.md": b"# MLC\n",
    }
    files.update(extra or {})
    return files


def _fake_safetensors(seed: int) -> bytes:
    header = json.dumps(
        {"__metadata__": {"format": "mlx"}, "w": {"dtype": "U8", "shape": [32], "data_offsets": [0, 32]}}
    ).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + bytes((seed * 7 + i) % 256 for i in range(32))


def populate(hub: FakeHub) -> FakeHub:
    """The standard set of repos every hub test can rely on."""
    hub.add_repo(GGUF_REPO, gguf_repo_files(), tags=("gguf", "llama"), downloads=500, likes=7)
    hub.add_repo(SPLIT_REPO, split_repo_files(), tags=("gguf",), downloads=50, likes=1)
    hub.add_repo(MLX_REPO, mlx_repo_files(), tags=("mlx", "safetensors"), downloads=300, likes=3)
    hub.add_repo(MLC_REPO, mlc_repo_files(), tags=("mlc-llm",), downloads=20, likes=0)
    hub.add_repo(
        GATED_REPO,
        {"Secret-Q4_K_M.gguf": make_gguf(seed=42), "README.md": b"gated\n"},
        gated=True,
        token=GATED_TOKEN,
        tags=("gguf",),
    )
    return hub
