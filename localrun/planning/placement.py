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
- MoE models (``expert_count``): the expert tensors (``blk.N.ffn_{gate,up,down}_exps``) are
  ``expert_share`` of the weights. When the whole model does not fit, the experts of the first
  ``n_cpu_moe`` layers stay in RAM (llama.cpp's ``--n-cpu-moe``, a tensor buffer-type override)
  before any layer leaves the GPU, so attention, the shared experts and the KV cache stay on it:
  the order llama-server's ``--fit`` takes (common/fit.cpp).
- several GPUs: each holds its own driver context and compute buffer (counted per device);
  layers go to them in proportion to their free memory (``tensor_split``).
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
#: llama.cpp's LLM_FFN_EXPS_REGEX (common/common.h): every layer's routed-expert tensors, what ``--cpu-moe``
#: keeps in RAM. Shared experts (``ffn_*_shexp``) and the router (``ffn_gate_inp``) do not match.
EXPS_PATTERN = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
#: GPU backends whose llama.cpp kernels have flash attention, which llama.cpp's default ("auto") turns on.
FLASH_BACKENDS = ("cuda", "metal", "hip", "vulkan")


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
    n_expert: int | None = None  # MoE: routed experts per layer
    expert_share: float = 0.0  # MoE: the share of the weights in routed-expert tensors

    @property
    def is_moe(self) -> bool:
        return bool(self.n_expert and self.n_expert > 1 and self.expert_share > 0 and self.n_layer)

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
            n_expert=(n_expert := _int(pick("expert_count", "num_local_experts", "num_experts", "n_routed_experts"))),
            expert_share=_expert_share(flat, n_layer, n_embd, n_expert) if n_expert and n_expert > 1 else 0.0,
        )

    @property
    def knows_kv(self) -> bool:
        return bool(self.n_head_kv and self.k_len and self.v_len)


def _expert_share(meta: Mapping[str, Any], n_layer: int | None, n_embd: int | None, n_expert: int) -> float:
    """The share of a MoE model's bytes in its routed experts: measured from the GGUF's tensors when the
    index has ``expert_bytes`` (bytes of ``*_exps`` tensors in the first file, against its ``size_bytes``),
    else estimated from the shape (three n_embd × expert_ff matrices per expert and layer)."""
    size = _int(meta.get("size_bytes"))
    measured = _int(meta.get("expert_bytes"))
    if measured and size:
        return min(0.99, measured / size)
    found = meta.get("scalars")
    scalars: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    arch = meta.get("architecture")
    eff = _int(scalars.get(f"{arch}.expert_feed_forward_length")) or _int(meta.get("moe_intermediate_size"))
    eff = eff or _int(meta.get("feed_forward_length"))
    params = _int(meta.get("n_params"))
    if not (n_layer and n_embd and eff and params):
        return 0.0
    return min(0.99, n_layer * n_expert * 3 * n_embd * eff / params)


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
    return int(sum(heads) * n_ctx * ((shape.k_len or 0) + (shape.v_len or 0)) * per_elem)


def compute_bytes(shape: ModelShape, n_ctx: int, *, on_gpu: bool, flash: bool = False, attention: bool = True) -> int:
    """The compute buffer a batch needs (see the module docstring for what counts where).

    ``flash``: flash attention never writes the n_head × n_ubatch × n_ctx score matrix. Without
    ``attention`` (a CPU that only runs MoE experts for GPU layers) only the activations count."""
    n_ub = min(N_UBATCH, n_ctx)
    n_embd = shape.n_embd or 4096
    n_head = shape.n_head or 32
    head_dim = shape.k_len or n_embd // n_head
    n_ff = shape.n_ff or 4 * n_embd
    activations = n_ub * 4 * (6 * n_embd + 2 * n_head * head_dim + 3 * n_ff)
    if not attention:
        return activations
    scores = 0 if flash else n_head * n_ub * n_ctx
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
    n_cpu_moe: int = 0  # MoE: the first layers whose expert tensors stay in RAM (all: n_layer)

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
    #: Usable memory of each GPU (free less the margin), in the order llama.cpp numbers them; () is one GPU.
    gpu_free: tuple[int, ...] = ()

    @property
    def n_devices(self) -> int:
        return max(1, len(self.gpu_free))

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
    n_cpu_moe: int | None = None,
) -> Placement:
    """Split one model at one context between host and GPU; ``None`` (layers, experts) places what fits.

    ``n_seq`` sequences of ``n_ctx`` tokens each (llama.cpp slots with a KV stream apiece)
    multiply the KV cache; the compute buffer is that of one sequence's context, since
    attention runs per stream. ``n_cpu_moe`` (MoE only; -1: all) keeps the expert tensors of
    the first that many layers in RAM; left to the planner, experts leave the GPU before layers do."""
    n_layer = shape.n_layer or 0
    total_layers = n_layer + 1  # the repeating blocks plus the output layer
    base = host_base_bytes(shape)
    kv_all = kv_cache_bytes(shape, n_ctx * n_seq, kv_type)
    moe = shape.is_moe
    per_expert_layer = weights * shape.expert_share / n_layer if moe else 0.0
    per_dense_layer = (weights - per_expert_layer * n_layer) / total_layers

    def split(n: int, m: int = 0) -> Placement:
        if n <= 0 or budget.backend == "cpu":
            host = base + weights + kv_all + compute_bytes(shape, n_ctx, on_gpu=False)
            return Placement(n_ctx, 0, weights, kv_all, host, 0, budget.ratio(host, 0))
        n = min(n, total_layers) if n_layer else total_layers
        m = min(max(0, m), n_layer) if moe else 0
        reps = min(n, n_layer)  # repeating layers on the GPU: the last ones; the output layer comes last
        on_gpu_layers = range(n_layer - reps, n_layer)
        kv_gpu = kv_cache_bytes(shape, n_ctx * n_seq, kv_type, on_gpu_layers) if reps < n_layer else kv_all
        if n >= total_layers and not m:
            w_gpu = weights
        else:
            experts_on_gpu = max(0, n_layer - max(n_layer - reps, m))
            w_gpu = int(per_dense_layer * (reps + (n >= total_layers)) + per_expert_layer * experts_on_gpu)
        flash = budget.backend in FLASH_BACKENDS
        per_device = GPU_CONTEXT.get(budget.backend, 256 * MIB) + compute_bytes(shape, n_ctx, on_gpu=True, flash=flash)
        gpu = per_device * budget.n_devices + w_gpu + kv_gpu
        host = base + (weights - w_gpu) + (kv_all - kv_gpu)
        if n < total_layers or m:  # the CPU computes its layers (or only the experts it holds) too
            host += compute_bytes(shape, n_ctx, on_gpu=False, flash=flash, attention=reps < n_layer)
        return Placement(n_ctx, n, weights, kv_all, host, gpu, budget.ratio(host, gpu), m)

    def fits(p: Placement) -> bool:
        return p.gpu <= budget.gpu

    asked_moe = None if n_cpu_moe is None else (n_layer if n_cpu_moe < 0 else n_cpu_moe)
    if n_gpu_layers is not None:
        n = total_layers if n_gpu_layers < 0 else n_gpu_layers
        if asked_moe is not None or not moe:
            return split(n, asked_moe or 0)
        return next((c for m in range(n_layer + 1) if fits(c := split(n, m))), split(n, n_layer))
    if budget.backend == "cpu":
        return split(0)
    if asked_moe is not None:
        return next((c for n in range(total_layers, 0, -1) if fits(c := split(n, asked_moe))), split(0))
    full = split(total_layers)
    if fits(full) or not n_layer:
        return full
    if moe:  # experts to RAM first, layer by layer from the front, as --fit does (a few dozen evaluations)
        fitted = next((c for m in range(1, n_layer + 1) if fits(c := split(total_layers, m))), None)
        if fitted is not None:
            return fitted
    keep = n_layer if moe else 0
    return next((c for n in range(n_layer, 0, -1) if fits(c := split(n, keep))), split(0))


def tensor_overrides(n_cpu_moe: int, n_layer: int) -> list[list[str]]:
    """The (pattern, buffer type) pairs that keep the first ``n_cpu_moe`` layers' experts in RAM:
    llama.cpp's ``--cpu-moe`` pattern for all of them, else ``--n-cpu-moe``'s one per layer."""
    if n_cpu_moe <= 0:
        return []
    if n_cpu_moe >= n_layer:
        return [[EXPS_PATTERN, "CPU"]]
    return [[rf"blk\.{i}{EXPS_PATTERN}", "CPU"] for i in range(n_cpu_moe)]


def verdict_for(ratio: float) -> str:
    return "wont-fit" if ratio > 1.0 else "tight" if ratio > TIGHT_RATIO else "fits"
