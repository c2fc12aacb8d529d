"""Loading a GGUF into llama.cpp and creating its context: the library (imported once per process),
the model with its placement options (:mod:`.overrides`), and the context's parameters from a plan
and its slot layout (:mod:`.cache.slots`). Bad options fail before anything is allocated.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from localrun.errors import InvalidModelFile, RuntimeUnavailable, UnsupportedFeature, WontFit
from localrun.runtimes.llamacpp.build_info import load_backends
from localrun.runtimes.llamacpp.cache.slots import Layout
from localrun.runtimes.llamacpp.native_log import NATIVE_LOG
from localrun.runtimes.llamacpp.probe import INSTALL_FIX
from localrun.runtimes.llamacpp.speculative.drafting import MAX_DRAFT
from localrun.types import Format, ModelRecord, Plan

#: ggml type ids for ``Plan.kv_type`` (ggml.h ``enum ggml_type``).
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8}


@functools.lru_cache(maxsize=1)
def llama_lib() -> Any:
    """Import llama_cpp, init its backend and quiet its logging, once per process."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise RuntimeUnavailable(f"llama-cpp-python is not installed ({exc})", hint=INSTALL_FIX) from exc
    NATIVE_LOG.install(llama_cpp)  # after the import (it installs its own printer), before any work
    load_backends(llama_cpp)  # a portable (GGML_BACKEND_DL) build's CPU variants live in its lib/
    llama_cpp.llama_backend_init()
    return llama_cpp


def load_model(record: ModelRecord, plan: Plan) -> tuple[Any, Any, Layout, Any, Any]:
    """(llama_cpp, the loaded model, the slot layout, the context's parameters, the load parameters
    to hold until the model is freed) for ``record`` under ``plan``.

    Raises:
        UnsupportedFeature: not a GGUF, or an option llama.cpp does not take.
        InvalidModelFile: the file is missing or llama.cpp cannot load it.
    """
    if record.format is not Format.GGUF:
        raise UnsupportedFeature(
            f"llama.cpp runs GGUF files, not {record.format.value}",
            param="format",
            hint="pick a runtime that runs this format",
        )
    if not os.path.isfile(record.path):
        raise InvalidModelFile(f"model file not found: {record.path}", hint="re-import or pull the model")
    llama = llama_lib()
    layout = Layout.from_plan(plan)
    cp = context_params(llama, plan, layout)  # bad options fail before anything is allocated
    mp = llama.llama_model_default_params()
    mp.n_gpu_layers = int(plan.n_gpu_layers)
    if layout.exact and hasattr(mp, "use_extra_bufts"):
        # Repacked weights (AVX2 Q4_K 8x8, …) change a row's arithmetic with the rows
        # decoded beside it; measured here they bought no speed on Gemma 3 270M.
        mp.use_extra_bufts = bool(plan.options.get("repack", False))
    from localrun.runtimes.llamacpp import overrides  # MoE experts to RAM, several GPUs (see overrides.py)

    load_params = overrides.apply(llama, mp, plan.options)  # held until the model is freed
    NATIVE_LOG.take_recent()
    model = llama.llama_model_load_from_file(os.fsencode(record.path), mp)
    if not model:
        why = NATIVE_LOG.take_recent()
        raise InvalidModelFile(
            f"llama.cpp could not load {record.path}" + (f": {why}" if why else ""),
            hint="the file may be corrupt or an architecture this llama.cpp does not know",
        )
    return llama, model, layout, cp, load_params


def new_context(llama: Any, model: Any, cp: Any, layout: Layout, name: str) -> Any:
    """A context for ``model`` with parameters ``cp``.

    Raises:
        WontFit: llama.cpp could not allocate it.
    """
    ctx = llama.llama_init_from_model(model, cp)
    if ctx:
        return ctx
    why = NATIVE_LOG.take_recent()
    raise WontFit(
        f"llama.cpp could not create a {layout.n_ctx}-token context ({layout.n_slots} slots) for "
        f"{name}" + (f": {why}" if why else ""),
        hint="lower the context length, the slots or the GPU layers",
    )


def context_params(llama: Any, plan: Plan, layout: Layout) -> Any:
    """``llama_context_params`` for ``plan`` and ``layout``.

    Raises:
        UnsupportedFeature: an unknown ``plan.kv_type``.
    """
    cp = llama.llama_context_default_params()
    cp.n_ctx = int(layout.n_ctx)
    cp.n_batch = max(layout.step_tokens, layout.n_slots, MAX_DRAFT + 1)  # a verification pass is one call
    cp.n_ubatch = min(cp.n_batch, 512)
    cp.n_seq_max = layout.n_slots
    cp.kv_unified = layout.unified
    # Both, explicitly: a default n_threads_batch of cpu_count/2 made prefill 50x slower
    # in llama-cpp-python's server on a 2-core box.
    cp.n_threads = cp.n_threads_batch = max(1, int(plan.n_threads))
    kv = KV_TYPES.get(plan.kv_type)
    if kv is None:
        raise UnsupportedFeature(
            f"unknown KV cache type {plan.kv_type!r}", param="kv_type", hint="use one of: " + ", ".join(KV_TYPES)
        )
    cp.type_k = cp.type_v = kv
    if layout.exact_prefix:
        # Flash attention on the CPU makes a prefill's result depend on its chunking
        # (see llamacpp/scheduler.py), so a cached prefix would differ from a cold one in the last bits.
        cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if kv not in (0, 1):  # a quantized V cache needs flash attention
        cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
    if "swa_full" in plan.options:
        # Sliding-window layers (Gemma 3) get a full-size cache by llama.cpp's default, so
        # any cached prefix can be reused. False keeps only the window (less memory); the
        # prefix cache then refuses a prefix whose window was already overwritten.
        cp.swa_full = bool(plan.options["swa_full"])
    if "flash_attn" in plan.options:
        flag = plan.options["flash_attn"]
        cp.flash_attn_type = (
            llama.LLAMA_FLASH_ATTN_TYPE_AUTO
            if flag is None
            else llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if flag
            else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
    return cp
