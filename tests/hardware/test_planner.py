"""The planner on four machines (JSON profiles) with GGUF records built from plain dicts."""

from __future__ import annotations

import dataclasses

import pytest

from localrun.errors import ConfigError, RuntimeUnavailable, UnknownRuntime, WontFit
from localrun.planning.context import MIN_CONTEXT
from localrun.planning.placement import (
    GPU_CONTEXT,
    KV_BYTES,
    TIGHT_RATIO,
    ModelShape,
    compute_bytes,
    host_base_bytes,
    kv_cache_bytes,
    weights_bytes,
)
from localrun.planning.planner import (
    PlanOverrides,
    plan_placement,
    require_fit,
)
from localrun.planning.render import render_plan
from localrun.settings import Settings
from localrun.types import Format, MemoryEstimate, Plan
from tests.hardware.helpers import (
    LLAMA_8B,
    LLAMA_70B,
    LLAMA_405B,
    PROFILES,
    QWEN_05B,
    profile,
    record,
    statuses,
)

GPU_BUILD = {"rtx4090_desktop": "cuda", "m2_mac_16gb": "metal", "amd_gpu_box": "hip", "cpu_laptop_8gb": "cpu"}


def plan(meta, machine, st=None, **kw):
    st = st if st is not None else statuses(GPU_BUILD[machine])
    return plan_placement(record(meta), profile(machine), st, **kw)


def placement(p: Plan) -> dict:
    return p.options["placement"]


def kv_by_hand(meta, n_ctx, bytes_per=2.0):
    """The brief's formula, written out independently of the planner's code."""
    k = meta.get("key_length") or meta["embedding_length"] // meta["head_count"]
    v = meta.get("value_length") or meta["embedding_length"] // meta["head_count"]
    return int(meta["block_count"] * n_ctx * meta["head_count_kv"] * (k + v) * bytes_per)


# --- decisions on each machine -------------------------------------------------------------


def test_cpu_only_laptop_runs_a_small_model_on_cpu_with_its_physical_cores():
    hw = profile("cpu_laptop_8gb")
    p = plan(QWEN_05B, "cpu_laptop_8gb")
    assert (p.runtime, p.device, p.n_gpu_layers) == ("llama.cpp", "cpu", 0)
    assert p.n_threads == hw.physical_cores
    assert p.n_ctx == 4096 < QWEN_05B["context_length"]  # 8 GB of RAM: the 4k tier
    assert p.verdict == "fits"
    assert f"no GPU on this machine: running on CPU with {hw.physical_cores} threads" in p.reasons
    assert any(
        r.startswith("context 4,096 of the trained 32,768: capped by the default for 7.6 GiB of RAM (4k tier)")
        for r in p.reasons
    ), p.reasons


def test_cpu_only_laptop_shrinks_the_context_of_an_8b_model_to_fit():
    hw = profile("cpu_laptop_8gb")
    p = plan(LLAMA_8B, "cpu_laptop_8gb")
    assert MIN_CONTEXT <= p.n_ctx < 4096 and p.n_ctx % 256 == 0
    assert p.verdict in ("fits", "tight")
    assert p.memory.total <= hw.ram_available
    assert f"context reduced from 4,096 to {p.n_ctx:,} to fit in memory" in p.reasons
    # the next 256 tokens up would not have fitted at the same verdict: the context is the largest possible
    bigger = plan(LLAMA_8B, "cpu_laptop_8gb", overrides=PlanOverrides(n_ctx=p.n_ctx + 256))
    assert bigger.verdict != "fits"


def test_rtx_4090_runs_an_8b_model_fully_on_cuda():
    p = plan(LLAMA_8B, "rtx4090_desktop")
    layers = LLAMA_8B["block_count"] + 1
    assert (p.runtime, p.device, p.n_gpu_layers) == ("llama.cpp", "cuda", layers)
    assert p.verdict == "fits" and p.n_ctx == 32768  # 24 GB of VRAM: the 32k tier, as Ollama's
    assert any(r.startswith(f"all {layers} layers on CUDA (NVIDIA GeForce RTX 4090)") for r in p.reasons)
    assert placement(p)["gpu_bytes"] > p.memory.weights  # weights and KV cache live in VRAM
    assert placement(p)["host_bytes"] < 256 * 2**20


def test_rtx_4090_fits_a_70b_model_only_with_partial_offload():
    hw = profile("rtx4090_desktop")
    p = plan(LLAMA_70B, "rtx4090_desktop")
    total = LLAMA_70B["block_count"] + 1
    assert p.device == "cuda" and 0 < p.n_gpu_layers < total
    assert p.verdict in ("fits", "tight")
    assert placement(p)["gpu_bytes"] <= hw.gpus[0].vram_free
    assert placement(p)["host_bytes"] <= hw.ram_available
    assert any(r.startswith(f"partial offload: {p.n_gpu_layers} of {total} layers on CUDA") for r in p.reasons)
    # one more layer would not fit in the usable VRAM: offload stops at the edge
    more = plan(LLAMA_70B, "rtx4090_desktop", overrides=PlanOverrides(n_gpu_layers=p.n_gpu_layers + 1, n_ctx=p.n_ctx))
    assert more.options["placement"]["gpu_bytes"] > placement(p)["gpu_budget"]


def test_405b_wont_fit_on_the_desktop_even_at_the_smallest_context():
    p = plan(LLAMA_405B, "rtx4090_desktop")
    assert p.verdict == "wont-fit" and p.n_ctx == MIN_CONTEXT
    assert any(r.startswith("does not fit: needs") and "of RAM at context 512" in r for r in p.reasons)
    with pytest.raises(WontFit) as err:
        require_fit(p, record(LLAMA_405B))
    assert "does not fit" in str(err.value) and err.value.hint


def test_m2_mac_runs_an_8b_model_on_metal_within_the_gpu_budget():
    hw = profile("m2_mac_16gb")
    p = plan(LLAMA_8B, "m2_mac_16gb")
    assert (p.device, p.n_gpu_layers) == ("metal", LLAMA_8B["block_count"] + 1)
    assert placement(p)["gpu_bytes"] <= hw.apple.gpu_working_set_budget
    assert placement(p)["unified"] is True
    assert p.n_threads == hw.physical_cores
    assert any("Metal (Apple M2)" in r for r in p.reasons)


def test_m2_mac_cannot_run_a_70b_model():
    p = plan(LLAMA_70B, "m2_mac_16gb")
    assert p.verdict == "wont-fit"
    assert any(r.startswith("does not fit") for r in p.reasons)


def test_amd_box_offloads_with_a_hip_build():
    p = plan(LLAMA_8B, "amd_gpu_box")
    assert p.device == "hip" and p.n_gpu_layers == LLAMA_8B["block_count"] + 1
    assert any("AMD Radeon RX 7900 XTX" in r for r in p.reasons)


def test_cpu_only_build_on_a_gpu_box_explains_the_unused_gpu():
    st = statuses("cpu")
    st["llama.cpp"] = type(st["llama.cpp"])(**{**st["llama.cpp"].__dict__, "fix": 'CMAKE_ARGS="-DGGML_HIP=on" pip …'})
    p = plan(LLAMA_8B, "amd_gpu_box", st)
    assert p.device == "cpu" and p.n_gpu_layers == 0
    reason = p.reasons[0]
    assert "built without GPU offload" in reason and "AMD Radeon RX 7900 XTX" in reason and "-DGGML_HIP=on" in reason


def test_cuda_build_on_a_machine_without_nvidia_runs_on_cpu_and_says_why():
    p = plan(QWEN_05B, "cpu_laptop_8gb", statuses("cuda"))
    assert p.device == "cpu"
    assert p.reasons[0].startswith("llama.cpp is built with CUDA but no GPU for it was found")


# --- runtime choice --------------------------------------------------------------------------


def test_ollama_is_used_when_llama_cpp_is_missing_and_ollama_is_up():
    p = plan(LLAMA_8B, "rtx4090_desktop", statuses(None, ollama=True))
    assert p.runtime == "ollama"
    assert p.reasons[0].startswith("llama.cpp is unavailable (llama-cpp-python is not installed): using ollama 0.12.3")
    assert p.options["num_ctx"] == p.n_ctx and p.options["num_gpu"] == p.n_gpu_layers


def test_ollama_when_the_user_asks_for_it():
    p = plan(QWEN_05B, "cpu_laptop_8gb", statuses("cpu", ollama=True), overrides=PlanOverrides(runtime="ollama"))
    assert p.runtime == "ollama" and p.options["num_thread"] == p.n_threads


def test_no_runtime_for_gguf_names_every_reason_and_fix():
    with pytest.raises(RuntimeUnavailable) as err:
        plan(QWEN_05B, "cpu_laptop_8gb", statuses(None, ollama=False))
    assert "llama-cpp-python is not installed" in err.value.message and "no Ollama server" in err.value.message
    assert "localrun[llama]" in err.value.hint and "ollama serve" in err.value.hint


def test_unknown_runtime_lists_the_valid_names():
    with pytest.raises(UnknownRuntime) as err:
        plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(runtime="exllama"))
    for name in ("llama.cpp", "mlx", "ollama", "mlc"):
        assert name in err.value.hint


def test_asking_for_an_unavailable_runtime_gives_its_reason_and_fix():
    with pytest.raises(RuntimeUnavailable) as err:
        plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(runtime="ollama"))
    assert "no Ollama server" in err.value.message and err.value.hint == "ollama serve"


def test_asking_for_a_runtime_that_cannot_read_the_format():
    with pytest.raises(RuntimeUnavailable) as err:
        plan(QWEN_05B, "m2_mac_16gb", statuses("metal", mlx="metal"), overrides=PlanOverrides(runtime="mlx"))
    assert "cannot run GGUF" in err.value.message


def test_registry_only_runtime_needs_no_probe():
    p = plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(runtime="fake"))
    assert p.runtime == "fake" and p.device == "cpu"


def test_mlx_model_runs_on_mlx_and_metal():
    meta = {
        "num_hidden_layers": 28,
        "hidden_size": 3072,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "vocab_size": 128256,
        "intermediate_size": 8192,
        "size_bytes": 1_800_000_000,
    }
    p = plan_placement(record(meta, fmt=Format.MLX), profile("m2_mac_16gb"), statuses("metal", mlx="metal"))
    assert (p.runtime, p.device) == ("mlx", "metal") and p.verdict == "fits"
    assert p.memory.kv_cache == kv_cache_bytes(ModelShape.from_metadata(meta), p.n_ctx) > 0


def test_mlx_model_without_mlx_says_how_to_install_it():
    with pytest.raises(RuntimeUnavailable) as err:
        plan_placement(record({"size_bytes": 10**9}, fmt=Format.MLX), profile("cpu_laptop_8gb"), statuses("cpu"))
    assert "localrun[mlx]" in err.value.hint


def test_mlc_model_runs_on_mlc():
    meta = {
        "context_window_size": 4096,
        "vocab_size": 32000,
        "model_config": {
            "num_hidden_layers": 22,
            "hidden_size": 2048,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "intermediate_size": 5632,
        },
        "size_bytes": 600_000_000,
    }
    p = plan_placement(record(meta, fmt=Format.MLC), profile("rtx4090_desktop"), statuses("cuda", mlc=True))
    assert (p.runtime, p.device, p.n_ctx) == ("mlc", "cuda", 4096)


# --- overrides ------------------------------------------------------------------------------


def test_explicit_context_is_kept_even_when_it_does_not_fit():
    p = plan(LLAMA_8B, "cpu_laptop_8gb", overrides=PlanOverrides(n_ctx=65536))
    assert p.n_ctx == 65536 and p.verdict == "wont-fit"
    assert not any("reduced" in r for r in p.reasons)


def test_explicit_context_beyond_the_trained_length_is_capped_with_a_reason():
    p = plan(QWEN_05B, "rtx4090_desktop", overrides=PlanOverrides(n_ctx=100_000))
    assert p.n_ctx == QWEN_05B["context_length"]
    assert "context 100,000 asked for by --ctx, but the model was trained on 32,768: using 32,768" in p.reasons


def test_settings_context_length_caps_the_context():
    settings = Settings(runtime={"context_length": 4096})
    p = plan(QWEN_05B, "rtx4090_desktop", settings=settings)
    assert p.n_ctx == 4096
    assert any(
        r.startswith("context 4,096 of the trained 32,768: capped by runtime.context_length in the settings")
        for r in p.reasons
    )


def test_max_context_default_comes_from_settings():
    p = plan(QWEN_05B, "rtx4090_desktop", settings=Settings(runtime={"max_context_default": 16384}))
    assert p.n_ctx == 16384


def test_threads_override_and_setting():
    assert plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(threads=3)).n_threads == 3
    assert plan(QWEN_05B, "cpu_laptop_8gb", settings=Settings(runtime={"threads": 6})).n_threads == 6


@pytest.mark.parametrize("layers, expected", [(10, 10), (-1, 33), (0, 0), (500, 33)])
def test_gpu_layers_override(layers, expected):
    p = plan(LLAMA_8B, "rtx4090_desktop", overrides=PlanOverrides(n_gpu_layers=layers))
    assert p.n_gpu_layers == expected
    assert p.device == ("cuda" if expected else "cpu")


def test_device_cpu_on_a_gpu_box():
    p = plan(LLAMA_8B, "rtx4090_desktop", overrides=PlanOverrides(device="cpu"))
    assert (p.device, p.n_gpu_layers) == ("cpu", 0)
    assert p.reasons[0].startswith("CPU requested: running on CPU")


@pytest.mark.parametrize(
    "over", [PlanOverrides(device="cuda"), PlanOverrides(device="gpu"), PlanOverrides(n_gpu_layers=5)]
)
def test_asking_for_a_gpu_the_build_cannot_use(over):
    with pytest.raises(RuntimeUnavailable) as err:
        plan(QWEN_05B, "cpu_laptop_8gb", overrides=over)
    assert "cannot use a GPU" in err.value.message


def test_asking_for_another_gpu_backend_than_the_build_has():
    with pytest.raises(RuntimeUnavailable) as err:
        plan(QWEN_05B, "rtx4090_desktop", overrides=PlanOverrides(device="vulkan"))
    assert "CUDA" in err.value.message and "VULKAN" in err.value.message


@pytest.mark.parametrize("over", [PlanOverrides(device="tpu"), PlanOverrides(kv_type="q3"), PlanOverrides(n_ctx=0)])
def test_bad_overrides_are_config_errors(over):
    with pytest.raises(ConfigError):
        plan(QWEN_05B, "cpu_laptop_8gb", overrides=over)


def test_quantized_kv_cache_shrinks_the_estimate():
    f16 = plan(LLAMA_8B, "rtx4090_desktop")
    q8 = plan(LLAMA_8B, "rtx4090_desktop", overrides=PlanOverrides(kv_type="q8_0"))
    assert q8.kv_type == "q8_0"
    assert (
        q8.memory.kv_cache
        == kv_by_hand(LLAMA_8B, q8.n_ctx, KV_BYTES["q8_0"]) * q8.options["n_slots"]
        < f16.memory.kv_cache
    )


# --- memory arithmetic ----------------------------------------------------------------------


@pytest.mark.parametrize("meta", [LLAMA_8B, QWEN_05B])
def test_kv_cache_matches_the_formula(meta):
    p = plan(meta, "rtx4090_desktop")
    assert p.memory.kv_cache == kv_by_hand(meta, p.n_ctx) * p.options["n_slots"]  # each slot holds the whole context
    assert p.memory.weights == meta["size_bytes"]


def test_missing_key_length_falls_back_to_embedding_over_heads():
    explicit = {**LLAMA_8B, "key_length": 128, "value_length": 128}
    assert plan(explicit, "rtx4090_desktop").memory == plan(LLAMA_8B, "rtx4090_desktop").memory


def test_per_layer_kv_heads_are_summed():
    heads = [8 if i % 4 == 3 else 0 for i in range(LLAMA_8B["block_count"])]  # a hybrid: 1 attention layer in 4
    meta = {**LLAMA_8B, "head_count_kv_per_layer": heads}
    p = plan(meta, "rtx4090_desktop")
    assert p.memory.kv_cache == sum(heads) * p.n_ctx * 256 * 2 * p.options["n_slots"]
    assert p.memory.kv_cache == plan({**LLAMA_8B, "head_count_kv_list": heads}, "rtx4090_desktop").memory.kv_cache


def test_weights_are_the_sum_of_all_shards():
    r = record(LLAMA_70B, shards=3)
    assert len(r.files) == 3
    p = plan_placement(r, profile("rtx4090_desktop"), statuses("cuda"))
    assert p.memory.weights == LLAMA_70B["size_bytes"]


def test_metadata_without_a_shape_is_still_planned_and_says_what_is_missing():
    p = plan({"size_bytes": 2 * 10**9}, "cpu_laptop_8gb")
    assert p.memory.kv_cache == 0 and p.memory.weights == 2 * 10**9
    assert "the metadata lacks layer and head counts: the KV cache is not counted" in p.reasons
    assert any(r.startswith("the model does not state its trained context: using 4,096") for r in p.reasons)


def test_memory_grows_with_context():
    small = plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(n_ctx=2048))
    big = plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(n_ctx=16384))
    assert big.memory.kv_cache == 8 * small.memory.kv_cache
    assert big.memory.overhead > small.memory.overhead > host_base_bytes(ModelShape.from_metadata(QWEN_05B))


def test_a_gpu_reserves_the_logits_of_a_whole_batch():
    shape = ModelShape.from_metadata(LLAMA_8B)
    assert compute_bytes(shape, 2048, on_gpu=True) >= LLAMA_8B["vocab_size"] * 512 * 4


@pytest.mark.parametrize("share, verdict", [(0.5, "fits"), (0.9, "tight"), (1.1, "wont-fit")])
def test_verdict_follows_the_share_of_available_memory(share, verdict):
    one = PlanOverrides(n_ctx=4096, parallel=1)  # the slot count stays put while memory changes
    need = plan(QWEN_05B, "cpu_laptop_8gb", overrides=one).memory.total
    hw = profile("cpu_laptop_8gb")
    hw = type(hw).from_dict({**hw.to_dict(), "ram_available": int(need / share)})
    p = plan_placement(record(QWEN_05B), hw, statuses("cpu"), overrides=one)
    assert p.verdict == verdict
    assert p.options["placement"]["ratio"] == pytest.approx(share, rel=1e-3)
    if verdict == "tight":
        assert any(r.startswith("tight: needs") for r in p.reasons)
    assert TIGHT_RATIO == 0.8


@pytest.mark.parametrize("gpu_gib, verdict", [(5, "fits"), (10, "fits"), (10.5, "tight"), (11.5, "wont-fit")])
def test_the_vram_margin_is_the_tight_zone(gpu_gib, verdict):
    from localrun.planning.placement import Budget, verdict_for

    gib = 2**30
    budget = Budget("cuda", host=64 * gib, gpu=10 * gib, gpu_margin=1 * gib)
    ratio = budget.ratio(1 * gib, int(gpu_gib * gib))
    assert verdict_for(ratio) == verdict
    if gpu_gib <= 10:
        assert ratio == pytest.approx(TIGHT_RATIO * gpu_gib / 10)


def estimate_for(metadata, *, file_sizes, n_ctx: int, on_gpu: bool = False, n_seq: int = 1) -> MemoryEstimate:
    """Memory for a model not downloaded yet (hub file sizes plus its GGUF header), from the
    placement module's parts at the plan's context: the planner's sums, redone."""
    shape = ModelShape.from_metadata(metadata)
    overhead = host_base_bytes(shape) + compute_bytes(shape, n_ctx, on_gpu=on_gpu)
    overhead += GPU_CONTEXT["cuda"] if on_gpu else 0
    kv = kv_cache_bytes(shape, n_ctx * n_seq, "f16")
    return MemoryEstimate(weights=weights_bytes(file_sizes, metadata), kv_cache=kv, overhead=overhead)


def test_estimate_for_a_model_not_yet_downloaded_matches_the_cpu_plan():
    p = plan(QWEN_05B, "cpu_laptop_8gb")
    est = estimate_for(
        QWEN_05B,
        file_sizes=[QWEN_05B["size_bytes"] // 2, QWEN_05B["size_bytes"] - QWEN_05B["size_bytes"] // 2],
        n_ctx=p.n_ctx,
        n_seq=p.options["n_slots"],
    )
    assert est == dataclasses.replace(p.memory, prompt_cache=0)  # the RAM tier's room is the planner's own choice
    assert p.memory.ceiling == p.memory.total + p.memory.prompt_cache > p.memory.total
    gpu = estimate_for(
        QWEN_05B, file_sizes=QWEN_05B["size_bytes"], n_ctx=p.n_ctx, on_gpu=True, n_seq=p.options["n_slots"]
    )
    assert gpu.total > est.total  # a GPU's reservations come on top


# --- output ---------------------------------------------------------------------------------


@pytest.mark.parametrize("machine", PROFILES)
def test_plans_round_trip_and_render(machine):
    r = record(LLAMA_8B, name="llama-3.1-8b")
    p = plan_placement(r, profile(machine), statuses(GPU_BUILD[machine]))
    assert Plan.from_dict(p.to_dict()) == p
    lines = render_plan(p, r)
    text = "\n".join(lines)
    assert lines[0].startswith("model     llama-3.1-8b (GGUF, Q4_K_M")
    assert f"verdict   {p.verdict}" in lines
    assert f"{p.n_ctx:,} tokens (trained 131,072)" in text
    for reason in p.reasons:
        assert reason in text


# --- parallel slots (llama.cpp) --------------------------------------------------------------


def _with_ram(machine: str, available: int):
    hw = profile(machine)
    return type(hw).from_dict({**hw.to_dict(), "ram_available": int(available)})


def test_parallel_slots_each_hold_the_whole_context_when_they_fit():
    p = plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(n_ctx=4096))
    one = plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(n_ctx=4096, parallel=1))
    assert (p.options["n_slots"], p.options["slot_ctx"], p.n_ctx) == (4, 4096, 4096)
    assert p.memory.kv_cache == 4 * one.memory.kv_cache
    assert p.memory.overhead == one.memory.overhead  # attention runs per slot: one compute buffer
    assert p.verdict == "fits"
    assert any(r.startswith("4 requests run at once") for r in p.reasons)
    assert "parallel  4 requests at once, each with the whole context" in render_plan(p, record(QWEN_05B))


def test_fewer_slots_when_four_would_not_fit_comfortably():
    one = plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(n_ctx=4096, parallel=1)).memory
    kv = one.kv_cache
    # room for the model and two slots' KV within the "fits" share, not three
    ram = (one.total + kv + kv // 2) / TIGHT_RATIO
    p = plan_placement(
        record(QWEN_05B), _with_ram("cpu_laptop_8gb", ram), statuses("cpu"), overrides=PlanOverrides(n_ctx=4096)
    )
    assert p.options["n_slots"] == 2 and p.verdict == "fits"
    # a model that is tight on its own gets one slot, and says why
    tight = plan_placement(
        record(QWEN_05B),
        _with_ram("cpu_laptop_8gb", one.total / 0.9),
        statuses("cpu"),
        overrides=PlanOverrides(n_ctx=4096),
    )
    assert tight.options["n_slots"] == 1 and tight.verdict == "tight"
    assert any(r.startswith("one request at a time") for r in tight.reasons)


def test_parallel_asked_for_is_kept_and_judged():
    one = plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(n_ctx=4096, parallel=1)).memory
    hw = _with_ram("cpu_laptop_8gb", one.total + 2 * one.kv_cache)  # 8 slots need 7 more KV caches
    p = plan_placement(record(QWEN_05B), hw, statuses("cpu"), overrides=PlanOverrides(n_ctx=4096, parallel=8))
    assert p.options["n_slots"] == 8 and p.n_ctx == 4096  # not shrunk: what was asked, with its verdict
    assert p.verdict == "wont-fit" and any("as asked" in r for r in p.reasons)
    with pytest.raises(ConfigError, match="parallel"):
        plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(parallel=0))


def test_parallel_from_the_settings_and_only_for_llama_cpp():
    from localrun.settings import Settings

    settings = Settings(runtime={"parallel": 2})
    p = plan(QWEN_05B, "cpu_laptop_8gb", settings=settings)
    assert p.options["n_slots"] == 2
    ollama = plan(QWEN_05B, "cpu_laptop_8gb", statuses(None, ollama=True), settings=settings)
    assert ollama.runtime == "ollama" and "n_slots" not in ollama.options  # Ollama schedules its own
    assert (
        ollama.memory.kv_cache == plan(QWEN_05B, "cpu_laptop_8gb", overrides=PlanOverrides(parallel=1)).memory.kv_cache
    )


# --- the runtimes' own formats, read through the registry ----------------------------------------


def test_the_planner_reads_each_runtimes_formats_from_its_class(monkeypatch):
    """No copy of the formats in the planner: a runtime that learns a format is chosen for it."""
    from localrun.runtimes.mlc import MlcRuntime

    with pytest.raises(RuntimeUnavailable):
        plan(QWEN_05B, "cpu_laptop_8gb", statuses(None, mlc=True))
    monkeypatch.setattr(MlcRuntime, "formats", frozenset({Format.MLC, Format.GGUF}))
    assert plan(QWEN_05B, "cpu_laptop_8gb", statuses(None, mlc=True)).runtime == "mlc"


def test_the_fake_runs_only_when_asked_for():
    """It can run every format, but it is not listed: never the planner's own choice."""
    with pytest.raises(RuntimeUnavailable) as err:
        plan(QWEN_05B, "cpu_laptop_8gb", statuses(None))
    assert "fake" not in err.value.message
    assert plan(QWEN_05B, "cpu_laptop_8gb", statuses(None), overrides=PlanOverrides(runtime="fake")).runtime == "fake"
