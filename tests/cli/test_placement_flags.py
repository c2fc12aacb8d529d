"""--kv-type, --cpu-moe, --n-cpu-moe (and serve's --gpu-layers) reach the planner from every command."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from localrun.cli import main


@pytest.fixture
def tiny_model():
    from tests.factories import write_tiny_llama_gguf

    return write_tiny_llama_gguf


def _plan(model, *args) -> dict:
    result = CliRunner().invoke(main, ["plan", str(model), "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["plan"]


def test_kv_type_reaches_the_plan_and_a_bad_one_is_refused(tmp_path, tiny_model):
    path = tiny_model(tmp_path / "tiny.gguf")
    assert _plan(path)["kv_type"] == "f16"
    assert _plan(path, "--kv-type", "Q8_0")["kv_type"] == "q8_0"
    bad = CliRunner().invoke(main, ["plan", str(path), "--kv-type", "q3"])
    assert bad.exit_code == 2 and "--kv-type" in bad.output


def test_moe_flags_become_plan_overrides(monkeypatch):
    from localrun.cli import common as cli_common

    seen = []
    placed = {"n_cpu_moe": -1, "kv_type": "q8_0"}
    monkeypatch.setattr(cli_common, "placement_overrides", lambda: seen.append(1) or placed)
    ov = cli_common.overrides_from(None, None, None, None, None)
    assert ov.n_cpu_moe == -1 and ov.kv_type == "q8_0" and seen


@pytest.mark.parametrize("command", ["plan", "run", "serve"])
def test_every_loading_command_has_the_placement_flags(command):
    out = CliRunner().invoke(main, [command, "--help"]).output
    for flag in ("--kv-type", "--cpu-moe", "--n-cpu-moe", "--gpu-layers"):
        assert flag in out, (command, flag)


def test_cpu_moe_and_n_cpu_moe_parse_into_the_context():
    import click

    from localrun.cli.output import placement_options, placement_overrides

    got = {}

    @click.command()
    @placement_options(gpu_layers=True)
    def probe():
        got.update(placement_overrides())

    assert CliRunner().invoke(probe, ["--cpu-moe", "--gpu-layers", "7"]).exit_code == 0
    assert got == {"n_cpu_moe": -1, "n_gpu_layers": 7}
    got.clear()
    assert CliRunner().invoke(probe, ["--n-cpu-moe", "12", "--kv-type", "q4_0"]).exit_code == 0
    assert got == {"n_cpu_moe": 12, "kv_type": "q4_0"}
