"""How many bytes a model needs and where they go: the planner's memory model.

Memory model (llama.cpp, the default GGUF runtime; numbers measured with llama-cpp-python
0.3.36 on Linux x86-64 against Gemma 3 270M and a tiny llama):

- weights: the sum of the file sizes (mmap'd; data ≈ file size).
- KV cache: n_layer × n_ctx × n_head_kv × (key_length + value_length) × bytes per element,
  summed per layer when head_count_kv is a list. llama-cpp-python allocates full-size caches
  for sliding-window layers (``swa_full``), so this is exact for it, not just a bound.
- overhead: the worker process itself (Python + llama_cpp, ~48 MiB), llama.cpp's vocabulary
  tables (~128 B per token: 32 MiB for a 262k vocabulary), and the compute buffer. On the CPU
  only the pages a full batch writes count: the attention scores of one layer
  (n_head × n_ubatch × n_ctx, f32 plus an f16 copy, no flash attention), the mask and the
  per-token activations. A GPU reserves its worst case up front, which for large vocabularies
  is the logits of a whole batch (n_vocab × n_ubatch × 4), plus its driver context.
- partial offload: weights_per_layer ≈ weights / (n_layer + 1); layers are offloaded while
  their weights and KV cache fit in free VRAM less a safety margin.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from localrun.planning.hardware import MIB
from localrun.types import ModelRecord

log = logging.getLogger(__name__)

TIGHT_RATIO = 0.8  # above this share of a budget the verdict is "tight"
N_UBATCH = 512  # llama-cpp-python's default n_batch / n_ubatch
KV_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
}
WORKER_BASE = 48 * MIB  # a worker's interpreter with the runtime library imported
VOCAB_BYTES_PER_TOKEN = 128  # llama.cpp's token text, scores, attributes and lookup maps
DEFAULT_VOCAB = 32_000  # when the metadata does not say
GPU_CONTEXT = {"cuda": 320 * MIB, "hip": 320 * MIB, "vulkan": 128 * MIB, "sycl": 256 * MIB, "metal": 0}


@dataclass(frozen=True)
class ModelShape:
    """The dimensions that drive memory, read tolerantly from GGUF metadata or an HF/MLC config."""

    n_layer: int | None = None
    n_ctx_train: int | None = None
    n_embd: int | None = None
    n_head: int | None = None
    n_head_kv: tuple[int, ...] = ()  # per layer
    k_len: int | None = None
    v_len: int | None = None
    n_ff: int | None = None
    n_vocab: int | None = None

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> ModelShape:
        flat = dict(meta)
        for nested in ("model_config", "text_config"):  # MLC and multimodal HF configs nest the shape
            if isinstance(meta.get(nested), Mapping):
                flat = {**meta[nested], **{k: v for k, v in flat.items() if v is not None}}

        def pick(*keys: str) -> Any:
            return next((flat[k] for k in keys if flat.get(k) is not None), None)

        n_layer = _int(pick("block_count", "num_hidden_layers", "n_layer", "num_layers"))
        n_embd = _int(pick("embedding_length", "hidden_size", "n_embd", "d_model"))
        n_head = _int(pick("head_count", "num_attention_heads", "n_head"))
        per_layer = pick("head_count_kv_list", "head_count_kv_per_layer")
        kv_heads = _int(pick("head_count_kv", "num_key_value_heads", "n_head_kv")) or n_head
        if isinstance(per_layer, (list, tuple)) and per_layer:
            heads = tuple(int(h) for h in per_layer)
        else:
            heads = (kv_heads,) * n_layer if n_layer and kv_heads else ()
        head_dim = _int(pick("head_dim")) or (n_embd // n_head if n_embd and n_head else None)
        return cls(
            n_layer=n_layer,
            n_ctx_train=_int(pick("context_length", "max_position_embeddings", "context_window_size")),
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=heads,
            k_len=_int(pick("key_length")) or head_dim,
            v_len=_int(pick("value_length")) or head_dim,
            n_ff=_int(pick("feed_forward_length", "intermediate_size")),
            n_vocab=_int(pick("vocab_size")),
        )

    @property
    def knows_kv(self) -> bool:
        return bool(self.n_head_kv and self.k_len and self.v_len)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and int(value) > 0 else None
    except (TypeError, ValueError):
        return None


def kv_cache_bytes(shape: ModelShape, n_ctx: int, kv_type: str = "f16", layers: Iterable[int] | None = None) -> int:
    """KV cache of the given layers (default all) at ``n_ctx``; 0 when the shape is unknown."""
    if not shape.knows_kv:
        return 0
    per_elem = KV_BYTES[kv_type]
    heads = shape.n_head_kv if layers is None else [shape.n_head_kv[i] for i in layers]
    return int(sum(heads) * n_ctx * (shape.k_len + shape.v_len) * per_elem)


def compute_bytes(shape: ModelShape, n_ctx: int, *, on_gpu: bool) -> int:
    """The compute buffer a batch needs (see the module docstring for what counts where)."""
    n_ub = min(N_UBATCH, n_ctx)
    n_embd = shape.n_embd or 4096
    n_head = shape.n_head or 32
    head_dim = shape.k_len or n_embd // n_head
    n_ff = shape.n_ff or 4 * n_embd
    activations = n_ub * 4 * (6 * n_embd + 2 * n_head * head_dim + 3 * n_ff)
    scores = n_head * n_ub * n_ctx
    mask = n_ctx * n_ub * 4
    if on_gpu:
        logits = (shape.n_vocab or DEFAULT_VOCAB) * n_ub * 4
        return max(scores * 4 + mask, logits) + activations
    return scores * 6 + mask + activations


def host_base_bytes(shape: ModelShape) -> int:
    return WORKER_BASE + (shape.n_vocab or DEFAULT_VOCAB) * VOCAB_BYTES_PER_TOKEN


def weights_bytes(record_or_sizes: ModelRecord | Iterable[int] | int, metadata: Mapping[str, Any] | None = None) -> int:
    if isinstance(record_or_sizes, ModelRecord):
        total = record_or_sizes.size
        metadata = record_or_sizes.metadata
    elif isinstance(record_or_sizes, int):
        total = record_or_sizes
    else:
        total = sum(record_or_sizes)
    return total or int((metadata or {}).get("size_bytes") or 0)


@dataclass(frozen=True)
class Placement:
    """Where the bytes of one candidate plan go, and how full each budget is."""

    n_ctx: int
    n_gpu_layers: int
    weights: int
    kv: int
    host: int
    gpu: int
    ratio: float

    @property
    def overhead(self) -> int:
        return self.host + self.gpu - self.weights - self.kv


@dataclass(frozen=True)
class Budget:
    """What the model may use: free RAM, and the GPU's free memory when there is one to use.

    ``gpu`` is what the planner fills when it offloads (free VRAM less ``gpu_margin``); the
    margin is the GPU's "tight" zone, so packing layers up to ``gpu`` still counts as fitting.
    """

    backend: str  # "cpu" or the GPU backend
    host: int
    gpu: int = 0
    gpu_margin: int = 0
    unified: bool = False  # Apple: GPU memory is RAM
    label: str = "CPU"

    def ratio(self, host: int, gpu: int) -> float:
        """Memory pressure of a placement: above TIGHT_RATIO it is tight, above 1.0 it does not fit."""
        parts = [_share(host, self.host)]
        if gpu:
            if gpu <= self.gpu:
                parts.append(TIGHT_RATIO * gpu / self.gpu)
            elif self.gpu_margin:
                parts.append(TIGHT_RATIO + (1 - TIGHT_RATIO) * (gpu - self.gpu) / self.gpu_margin)
            else:
                parts.append(_share(gpu, self.gpu) + (1 - TIGHT_RATIO) if self.gpu else float("inf"))
            if self.unified:
                parts.append(_share(host + gpu, self.host))
        return max(parts)


def _share(used: int, available: int) -> float:
    return used / available if available > 0 else float("inf")


def place(
    shape: ModelShape,
    weights: int,
    budget: Budget,
    n_ctx: int,
    *,
    n_gpu_layers: int | None = None,
    kv_type: str = "f16",
    n_seq: int = 1,
) -> Placement:
    """Split one model at one context between host and GPU; ``n_gpu_layers=None`` offloads what fits.

    ``n_seq`` sequences of ``n_ctx`` tokens each (llama.cpp slots with a KV stream apiece)
    multiply the KV cache; the compute buffer is that of one sequence's context, since
    attention runs per stream."""
    n_layer = shape.n_layer or 0
    total_layers = n_layer + 1  # the repeating blocks plus the output layer
    base = host_base_bytes(shape)
    kv_all = kv_cache_bytes(shape, n_ctx * n_seq, kv_type)

    def split(n: int) -> Placement:
        if n <= 0 or budget.backend == "cpu":
            host = base + weights + kv_all + compute_bytes(shape, n_ctx, on_gpu=False)
            return Placement(n_ctx, 0, weights, kv_all, host, 0, budget.ratio(host, 0))
        n = min(n, total_layers) if n_layer else total_layers
        on_gpu_layers = range(max(0, n_layer - n), n_layer) if n_layer else range(0)
        kv_gpu = kv_cache_bytes(shape, n_ctx * n_seq, kv_type, on_gpu_layers) if n < total_layers else kv_all
        w_gpu = weights if n >= total_layers else weights * n // total_layers
        gpu = GPU_CONTEXT.get(budget.backend, 256 * MIB) + w_gpu + kv_gpu + compute_bytes(shape, n_ctx, on_gpu=True)
        host = base + (weights - w_gpu) + (kv_all - kv_gpu)
        if n < total_layers:
            host += compute_bytes(shape, n_ctx, on_gpu=False)
        return Placement(n_ctx, n, weights, kv_all, host, gpu, budget.ratio(host, gpu))

    if n_gpu_layers is not None:
        return split(total_layers if n_gpu_layers < 0 else n_gpu_layers)
    if budget.backend == "cpu":
        return split(0)
    full = split(total_layers)
    if full.gpu <= budget.gpu or not n_layer:
        return full
    best = split(0)
    for n in range(n_layer, 0, -1):  # a few dozen cheap evaluations at most
        candidate = split(n)
        if candidate.gpu <= budget.gpu:
            best = candidate
            break
    return best


def verdict_for(ratio: float) -> str:
    return "wont-fit" if ratio > 1.0 else "tight" if ratio > TIGHT_RATIO else "fits"
