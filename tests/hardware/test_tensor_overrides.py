"""Tensor buffer-type overrides through llama_model_params, for real, on the CPU build.

A tiny qwen3moe (random weights, 4 experts) loads with its expert tensors pinned to the CPU
buffer type through the ctypes array runtimes/llamacpp/overrides.py builds, and answers; llama.cpp's
own log names each tensor it moved, which is the proof the array reached its loader. A pattern
that matches nothing moves nothing and changes no answer; a malformed one is refused by name."""

from __future__ import annotations

import logging
import re

import pytest

from localrun.errors import ConfigError
from localrun.planning.placement import EXPS_PATTERN, tensor_overrides
from localrun.types import Cancel, CompletionRequest, Format, ModelRecord, Plan, Sampling
from tests.conftest import needs_llama
from tests.hardware.moe_models import write_tiny_moe_gguf

pytestmark = [needs_llama, pytest.mark.llama]
MOVED = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    return write_tiny_moe_gguf(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf")


def _answer(path, caplog, **options) -> tuple[str, list[tuple[str, str]]]:
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime

    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="localrun.runtimes.llamacpp.native_log"):
        session = LlamaCppRuntime().load(
            ModelRecord(name="tiny-moe", format=Format.GGUF, path=str(path)),
            Plan(runtime="llama.cpp", n_ctx=128, n_threads=1, options=options),
        )
    try:
        req = CompletionRequest(prompt="hello world", sampling=Sampling(max_tokens=6, temperature=0.0))
        text = "".join(c.text for c in session.complete(req, Cancel()))
    finally:
        session.close()
    moved = [(m[1], m[2]) for r in caplog.records if (m := MOVED.search(r.getMessage()))]
    return text, moved


def test_experts_pinned_to_the_cpu_buffer_type_load_and_answer(tiny_moe, caplog):
    plain, none_moved = _answer(tiny_moe, caplog)
    assert none_moved == []
    text, moved = _answer(tiny_moe, caplog, tensor_overrides=tensor_overrides(2, 2))  # --cpu-moe's one pattern
    assert text == plain and text  # same weights, same arithmetic: the same greedy answer
    names = sorted(name for name, _ in moved)
    assert names == sorted(f"blk.{i}.ffn_{p}_exps.weight" for i in range(2) for p in ("gate", "up", "down"))
    assert all(buft.startswith("CPU") for _, buft in moved)


def test_n_cpu_moe_patterns_move_only_the_first_layers_experts(tiny_moe, caplog):
    patterns = tensor_overrides(1, 2)
    assert patterns == [[rf"blk\.0{EXPS_PATTERN}", "CPU"]]
    _, moved = _answer(tiny_moe, caplog, tensor_overrides=patterns)
    assert sorted(n for n, _ in moved) == [f"blk.0.ffn_{p}_exps.weight" for p in ("down", "gate", "up")]


def test_a_pattern_matching_nothing_moves_nothing_and_answers(tiny_moe, caplog):
    plain, _ = _answer(tiny_moe, caplog)
    text, moved = _answer(tiny_moe, caplog, tensor_overrides=[[r"blk\.99\.ffn_gate_exps", "CPU"]])
    assert moved == [] and text == plain


@pytest.mark.parametrize(
    ("pairs", "match"),
    [
        ([["blk\\.(0\\.ffn", "CPU"]], "not a valid regular expression"),
        ([["", "CPU"]], "non-empty string"),
        ([["exps"]], r"\[pattern, buffer type\]"),
        ([["exps", "NoSuchGPU7"]], "no llama.cpp device named 'NoSuchGPU7'"),
    ],
)
def test_a_malformed_override_is_refused_by_name_before_loading(tiny_moe, caplog, pairs, match):
    with pytest.raises(ConfigError, match=match):
        _answer(tiny_moe, caplog, tensor_overrides=pairs)


def test_llama_cpp_lists_its_own_devices_with_memory():
    import llama_cpp

    from localrun.runtimes.llamacpp.overrides import read_devices
    from localrun.runtimes.llamacpp.probe import probe_llamacpp

    devices = read_devices(llama_cpp)
    cpu = [d for d in devices if d["type"] == "cpu"]
    assert cpu and cpu[0]["total"] > 0 and 0 < cpu[0]["free"] <= cpu[0]["total"]
    status = probe_llamacpp(None)
    assert [d["name"] for d in status.details["devices"]] == [d["name"] for d in devices]
