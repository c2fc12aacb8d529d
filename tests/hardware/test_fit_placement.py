"""The planner places by memory like llama-server's --fit, on recorded GPU profiles.

Models are metadata-only GGUFs with the published files' tensor names, types and shapes
(tests/hardware/moe_models.py), indexed by localrun's own GGUF reader, so the expert bytes the
planner moves are the files' own. Profiles: one 24 GB card (rtx4090_desktop), one 8 GB card
(rtx4060_laptop_8gb), two unequal cards (two_gpus_24_12), Apple unified memory (m2_mac_16gb)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from localrun.planning.placement import EXPS_PATTERN, Budget, ModelShape, place, weights_bytes
from localrun.planning.planner import PlanOverrides, plan_placement
from localrun.planning.render import render_plan
from localrun.settings import Settings
from tests.hardware.helpers import LLAMA_70B, profile, record, statuses
from tests.hardware.moe_models import indexed, llama31_8b, qwen3_30b_a3b, qwen15_moe_a27b, tensor_names

BACKEND = {"rtx4090_desktop": "cuda", "rtx4060_laptop_8gb": "cuda", "two_gpus_24_12": "cuda", "m2_mac_16gb": "metal"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("sized")
    return {
        "qwen3-30b-a3b": qwen3_30b_a3b(root / "Qwen3-30B-A3B-Q4_K_M.gguf"),
        "qwen1.5-moe": qwen15_moe_a27b(root / "Qwen1.5-MoE-A2.7B-Q4_K_M.gguf"),
        "llama-3.1-8b": llama31_8b(root / "Llama-3.1-8B-Q4_K_M.gguf"),
    }


def plan(files, model, machine, **overrides):
    rec = indexed(files[model], model) if isinstance(model, str) else model
    ov = PlanOverrides(**overrides) if overrides else None
    p = plan_placement(rec, profile(machine), statuses(BACKEND[machine]), overrides=ov, settings=Settings())
    return p, rec, "\n".join(render_plan(p, rec))


def moved(patterns: list[list[str]], names: list[str]) -> list[str]:
    """The tensors llama.cpp's loader would send elsewhere: the first pattern that regex_search finds."""
    return [n for n in names if any(re.search(p, n) for p, _ in patterns)]


def test_the_index_counts_routed_expert_bytes_and_not_shared_ones(files):
    from localrun.modelstore.gguf_meta import read_gguf_metadata

    info = read_gguf_metadata(files["qwen1.5-moe"])
    exps = sum(t.n_bytes for t in info.tensors if t.name.endswith("_exps.weight"))
    shexp = sum(t.n_bytes for t in info.tensors if "shexp" in t.name)
    assert info.expert_bytes == exps and shexp > 0
    assert read_gguf_metadata(files["llama-3.1-8b"]).expert_bytes == 0
    shape = ModelShape.from_metadata(indexed(files["qwen3-30b-a3b"], "q").metadata)
    assert shape.is_moe and shape.n_expert == 128 and 0.9 < shape.expert_share < 0.99


def test_a_moe_that_fits_a_24_gb_card_runs_whole_on_it(files):
    p, _, words = plan(files, "qwen3-30b-a3b", "rtx4090_desktop")
    assert p.n_gpu_layers == 49 and p.options["n_cpu_moe"] == 0 and "tensor_overrides" not in p.options
    assert p.verdict == "fits" and "layers    49 of 49 on CUDA\n" in words
    assert "MoE with 128 experts: all of them on CUDA (NVIDIA GeForce RTX 4090)" in words


def test_on_an_8_gb_card_the_first_layers_experts_go_to_ram_before_any_layer_leaves(files):
    p, rec, words = plan(files, "qwen3-30b-a3b", "rtx4060_laptop_8gb")
    m = p.options["n_cpu_moe"]
    assert p.n_gpu_layers == 49 and 0 < m < 48 and p.verdict == "fits"
    assert p.options["tensor_overrides"] == [
        [rf"blk\.{i}\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"] for i in range(m)
    ]
    names = tensor_names(files["qwen3-30b-a3b"])
    assert moved(p.options["tensor_overrides"], names) == [
        f"blk.{i}.ffn_{x}_exps.weight" for i in range(m) for x in ("gate", "up", "down")
    ]
    # the fewest: one layer's experts fewer in RAM would not fit in the card's usable memory
    placed = p.options["placement"]
    budget = Budget("cuda", placed["host_budget"], placed["gpu_budget"])
    shape, weights = ModelShape.from_metadata(rec.metadata), weights_bytes(rec)
    assert (
        place(shape, weights, budget, p.n_ctx, n_gpu_layers=-1, n_cpu_moe=m - 1).gpu
        > placed["gpu_budget"]
        >= placed["gpu_bytes"]
    )
    assert f"layers    49 of 49 on CUDA, experts of {m} layers in RAM (--n-cpu-moe {m})" in words
    assert f"the experts of the first {m} of 48 layers" in words and "a tensor override to the CPU buffer type" in words


def test_shared_experts_the_router_and_attention_stay_on_the_gpu(files):
    p, _, _ = plan(files, "qwen1.5-moe", "rtx4060_laptop_8gb")
    assert p.options["n_cpu_moe"] > 0
    sent = moved(p.options["tensor_overrides"], tensor_names(files["qwen1.5-moe"]))
    assert sent and all(re.search(r"\.ffn_(gate|up|down)_exps\.weight$", n) for n in sent)
    assert not [n for n in sent if "shexp" in n or "gate_inp" in n or "attn" in n]


def test_cpu_moe_and_n_cpu_moe_and_gpu_layers_override_the_planner(files):
    p, _, words = plan(files, "qwen3-30b-a3b", "rtx4090_desktop", n_cpu_moe=-1)
    assert p.options["tensor_overrides"] == [[EXPS_PATTERN, "CPU"]] and p.options["n_cpu_moe"] == 48
    assert "(--cpu-moe, a tensor override to the CPU buffer type) as asked" in words
    p, _, _ = plan(files, "qwen3-30b-a3b", "rtx4090_desktop", n_cpu_moe=5)
    assert p.options["n_cpu_moe"] == 5 and len(p.options["tensor_overrides"]) == 5
    p, _, words = plan(files, "qwen3-30b-a3b", "rtx4060_laptop_8gb", n_gpu_layers=10)
    assert p.n_gpu_layers == 10 and "layers    10 of 49 on CUDA" in words
    assert moved(p.options.get("tensor_overrides", []), ["blk.47.attn_q.weight"]) == []


def test_a_dense_model_gets_no_overrides_and_full_offload_on_a_24_gb_card(files):
    p, _, words = plan(files, "llama-3.1-8b", "rtx4090_desktop")
    assert p.n_gpu_layers == 33 and "tensor_overrides" not in p.options and "n_cpu_moe" not in p.options
    assert "MoE" not in words and "flash attention: llama.cpp's auto" in words


def test_q8_0_kv_when_only_it_lets_the_asked_for_context_fit(files):
    p16, _, _ = plan(files, "llama-3.1-8b", "rtx4060_laptop_8gb", n_ctx=32768, kv_type="f16")
    p, _, words = plan(files, "llama-3.1-8b", "rtx4060_laptop_8gb", n_ctx=32768)
    assert p.kv_type == "q8_0" and p.n_ctx == 32768 and p.n_gpu_layers > p16.n_gpu_layers
    assert p.memory.kv_cache < p16.memory.kv_cache * 0.6
    assert "KV cache q8_0: the asked-for context and parallelism need 4.0 GiB of f16 cache" in words
    assert "flash attention on: the q8_0 KV cache needs it" in words
    default, _, _ = plan(files, "llama-3.1-8b", "rtx4060_laptop_8gb")  # nothing asked: f16, the context fits
    assert default.kv_type == "f16"


def test_two_unequal_cards_split_the_layers_by_free_memory(files):
    p, rec, words = plan(files, record(LLAMA_70B, name="llama-70b"), "two_gpus_24_12")
    free = [g.vram_free - 512 * 1024**2 for g in profile("two_gpus_24_12").gpus]
    assert p.options["tensor_split"] == pytest.approx([f / sum(free) for f in free], abs=1e-3)
    assert p.options["main_gpu"] == 0 and p.device == "cuda" and 0 < p.n_gpu_layers < 81
    assert "gpus      layers split 67% / 33% by free memory, main GPU 0" in words
    assert "CUDA (NVIDIA GeForce RTX 3090 + NVIDIA GeForce RTX 3060)" in words
    # each card pays its own driver context and compute buffer: two cards hold less than one of their sum
    one = dataclasses.replace(
        profile("two_gpus_24_12"),
        gpus=(
            dataclasses.replace(
                profile("two_gpus_24_12").gpus[0],
                vram_free=sum(g.vram_free for g in profile("two_gpus_24_12").gpus) - 512 * 1024**2,
            ),
        ),
    )
    single = plan_placement(rec, one, statuses("cuda"), settings=Settings())
    assert single.n_gpu_layers >= p.n_gpu_layers and "tensor_split" not in single.options


def test_the_split_follows_llama_cpps_own_device_order(files):
    st = statuses("cuda")
    small_first = [
        {
            "name": "CUDA0",
            "description": "NVIDIA GeForce RTX 3060",
            "type": "gpu",
            "free": 12 * 1024**3,
            "total": 12 * 1024**3,
        },
        {
            "name": "CUDA1",
            "description": "NVIDIA GeForce RTX 3090",
            "type": "gpu",
            "free": 24 * 1024**3,
            "total": 24 * 1024**3,
        },
        {"name": "CPU", "description": "AMD Ryzen 9", "type": "cpu", "free": 1, "total": 1},
    ]
    st["llama.cpp"] = dataclasses.replace(st["llama.cpp"], details={**st["llama.cpp"].details, "devices": small_first})
    p = plan_placement(record(LLAMA_70B, name="llama-70b"), profile("two_gpus_24_12"), st, settings=Settings())
    assert p.options["main_gpu"] == 1 and p.options["tensor_split"][0] < p.options["tensor_split"][1]


def test_apple_unified_memory_a_moe_within_metals_budget_and_one_beyond_ram(files):
    p, _, words = plan(files, "qwen1.5-moe", "m2_mac_16gb")
    assert p.device == "metal" and p.n_gpu_layers == 25 and p.verdict != "wont-fit"
    if p.options["n_cpu_moe"]:
        assert "stay with the CPU, outside Metal's working set" in words
    big, _, words = plan(files, "qwen3-30b-a3b", "m2_mac_16gb")
    assert big.verdict == "wont-fit" and "of memory" in words and "VRAM" not in words


def test_the_plan_says_which_backend_the_build_has_beside_the_machines(files):
    _, _, words = plan(files, "llama-3.1-8b", "rtx4090_desktop")
    assert "build     llama.cpp built for CUDA: the build this machine calls for" in words
    p = plan_placement(
        indexed(files["llama-3.1-8b"], "l"), profile("rtx4090_desktop"), statuses("cpu"), settings=Settings()
    )
    assert "build     llama.cpp built for CPU, but this machine could use CUDA" in "\n".join(
        render_plan(p, indexed(files["llama-3.1-8b"], "l"))
    )


def test_moe_flags_on_a_dense_model_or_the_cpu_say_they_change_nothing(files):
    p, _, words = plan(files, "llama-3.1-8b", "rtx4090_desktop", n_cpu_moe=-1)
    assert "tensor_overrides" not in p.options and "change nothing here: the model has no routed experts" in words
    p, _, words = plan(files, "qwen3-30b-a3b", "rtx4090_desktop", n_cpu_moe=4, device="cpu")
    assert "tensor_overrides" not in p.options and "change nothing here: no layer runs on a GPU" in words


def test_an_index_entry_from_before_expert_bytes_estimates_the_share_from_the_shape(files):
    meta = indexed(files["qwen3-30b-a3b"], "q").metadata
    measured = ModelShape.from_metadata(meta).expert_share
    older = {k: v for k, v in meta.items() if k != "expert_bytes"}
    assert ModelShape.from_metadata(older).expert_share == pytest.approx(measured, abs=0.03)
