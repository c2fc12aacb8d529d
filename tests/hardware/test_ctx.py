"""The context a model is loaded with: the user's to set (--ctx > [models."NAME"] ctx > runtime.ctx > default),
and a default that is the trained context within Ollama-like memory tiers (localrun/planning/context.py)."""

from __future__ import annotations

import dataclasses

import pytest

from localrun.planning.context import GIB, tier_for
from localrun.planning.placement import Budget
from localrun.planning.planner import PlanOverrides, plan_placement
from localrun.planning.render import render_plan
from localrun.settings import Settings
from tests.hardware.helpers import LLAMA_8B, QWEN_05B, profile, record, statuses

#: This project's CI box: 24 GB of RAM (23.5 GiB), no GPU.
BOX_24GB = dataclasses.replace(
    profile("cpu_laptop_8gb"), ram_total=25_275_990_016, ram_available=23_000_000_000, physical_cores=2
)
#: Gemma 3 270M as its GGUF states it (read from gemma-3-270m-Q4_K_M.gguf).
GEMMA_270M = {
    "architecture": "gemma3",
    "context_length": 32768,
    "block_count": 18,
    "embedding_length": 640,
    "feed_forward_length": 2048,
    "head_count": 4,
    "head_count_kv": 1,
    "key_length": 256,
    "value_length": 256,
    "vocab_size": 262144,
    "quant": "Q4_K_M",
    "size_bytes": 253_115_904,
}


def plan(meta, hw=BOX_24GB, *, settings=None, overrides=None, name="model"):
    return plan_placement(record(meta, name=name), hw, statuses("cpu"), settings=settings, overrides=overrides)


def test_gemma_270m_gets_its_trained_32k_on_a_24gb_box_and_plan_says_why():
    p = plan(GEMMA_270M, name="gemma3-270m")
    assert p.n_ctx == 32768 and p.verdict == "fits"
    why = next(r for r in p.reasons if r.startswith("context 32,768"))
    assert "the model's trained context, within the default for 23.5 GiB of RAM (32k tier)" in why
    assert "--ctx" in why and "runtime.ctx" in why and '[models."NAME"] ctx' in why


def test_gemma_gguf_metadata_matches_the_figures_used_here(gemma_gguf):
    from localrun.modelstore.gguf_meta import read_gguf_metadata

    meta = read_gguf_metadata(gemma_gguf).as_dict()
    for key in ("context_length", "block_count", "head_count_kv", "key_length", "embedding_length"):
        assert meta[key] == GEMMA_270M[key], key


@pytest.mark.parametrize("ram_gib, tier", [(7.6, 4096), (16, 4096), (23.5, 32768), (64, 32768), (128, 262_144)])
def test_ram_tiers(ram_gib, tier):
    hw = dataclasses.replace(BOX_24GB, ram_total=int(ram_gib * GIB))
    assert tier_for(Budget("cpu", hw.ram_available), hw)[0] == tier


@pytest.mark.parametrize("vram_gib, tier", [(8, 4096), (22.5, 4096), (24, 32768), (48, 262_144), (80, 262_144)])
def test_gpu_tiers_are_ollamas(vram_gib, tier):
    gib = int(vram_gib * GIB)
    budget = Budget("cuda", 64 * GIB, gib - 512 * 2**20, gpu_margin=512 * 2**20, label="CUDA")
    assert tier_for(budget, BOX_24GB)[0] == tier


def test_the_default_steps_down_a_tier_when_the_trained_context_does_not_fit_comfortably():
    big_ram = dataclasses.replace(BOX_24GB, ram_total=128 * GIB, ram_available=16 * GIB)
    p = plan(LLAMA_8B, big_ram)  # 256k tier, trained 128k: 16 GiB of KV cache alone would not fit 16 GiB
    assert p.n_ctx == 32768 and p.verdict == "fits"
    assert "context reduced from 131,072 to 32,768 to fit in memory" in p.reasons


def test_precedence_cli_over_model_over_runtime_over_default():
    settings = Settings(runtime={"ctx": 2048}, models={"m": {"ctx": 1024}, "*": {"ctx": 3072}})
    assert plan(QWEN_05B, settings=Settings()).n_ctx == 32768
    assert plan(QWEN_05B, settings=Settings(runtime={"ctx": 2048})).n_ctx == 2048
    assert plan(QWEN_05B, settings=settings, name="other").n_ctx == 3072  # [models."*"] beats runtime.ctx
    p = plan(QWEN_05B, settings=settings, name="m")
    assert p.n_ctx == 1024 and '[models."m"] ctx in config.toml' in p.options["ctx_source"]
    p = plan(QWEN_05B, settings=settings, name="m", overrides=PlanOverrides(n_ctx=512))
    assert p.n_ctx == 512 and p.options["ctx_source"] == "--ctx"
    assert "context 512 set by --ctx" in p.reasons
    line = next(x for x in render_plan(p, record(QWEN_05B, name="m")) if x.startswith("context"))
    assert "set by --ctx" in line


def test_runtime_ctx_from_the_environment_and_config_file(monkeypatch, tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('[runtime]\nctx = 6144\n\n[models."gemma3-270m"]\nctx = 16384\n')
    monkeypatch.setenv("LOCALRUN_CONFIG", str(cfg))
    s = Settings()
    assert s.runtime.ctx == 6144 and s.models["gemma3-270m"].ctx == 16384
    assert plan(GEMMA_270M, settings=s, name="gemma3-270m").n_ctx == 16384
    assert plan(GEMMA_270M, settings=s, name="other").n_ctx == 6144
    monkeypatch.setenv("LOCALRUN_RUNTIME__CTX", "4096")
    assert Settings().runtime.ctx == 4096


def test_a_set_context_is_kept_even_when_it_does_not_fit():
    small = profile("cpu_laptop_8gb")
    p = plan(LLAMA_8B, small, settings=Settings(runtime={"ctx": 65536}))
    assert p.n_ctx == 65536 and p.verdict == "wont-fit"
