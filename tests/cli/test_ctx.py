"""``--ctx`` on ``serve``, ``run`` and ``plan``, and ``plan`` saying where the context came from."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from localrun.cli import main


@pytest.fixture
def long_model(tmp_path):
    from tests.factories import write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "long.gguf", n_ctx_train=65536)
    assert CliRunner().invoke(main, ["import", str(path), "--name", "long"]).exit_code == 0
    return "long"


def _plan(*args, env=None) -> dict:
    result = CliRunner().invoke(main, ["plan", "long", "--json", *args], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["plan"]


def test_plan_ctx_and_its_source(long_model, tmp_path, monkeypatch):
    plan = _plan("--ctx", "3072")
    assert plan["n_ctx"] == 3072 and plan["options"]["ctx_source"] == "--ctx"
    cfg = tmp_path / "config.toml"
    cfg.write_text('[runtime]\nctx = 2048\n\n[models."long"]\nctx = 5120\n')
    monkeypatch.setenv("LOCALRUN_CONFIG", str(cfg))
    assert _plan()["n_ctx"] == 5120
    assert _plan("--ctx", "1024")["n_ctx"] == 1024
    text = " ".join(CliRunner().invoke(main, ["plan", "long"]).output.split())  # rich wraps at 80 columns
    assert 'set by [models."long"] ctx in config.toml' in text and "context 5,120 set by" in text


def test_plan_explains_the_default_in_words_with_the_numbers(long_model):
    text = " ".join(CliRunner().invoke(main, ["plan", "long"]).output.split())
    found = re.search(
        r"- context [\d,]+(: the model's trained context, within| of the trained 65,536: capped by)"
        r" the default for [\d.]+ GiB of RAM \((4|32|256)k tier\); --ctx",
        text,
    )
    assert found, text


def test_serve_ctx_reaches_the_planner_and_beats_the_settings(long_model, tmp_path, monkeypatch):
    import localrun.server.serve as serve

    cfg = tmp_path / "config.toml"
    cfg.write_text('[models."long"]\nctx = 5120\n')
    monkeypatch.setenv("LOCALRUN_CONFIG", str(cfg))
    seen = {}

    def fake_run_server(settings, manager, ready_callback=None):
        record = manager.store.resolve("long")
        seen["plan"] = manager.plan_for(record)

    monkeypatch.setattr(serve, "run_server", fake_run_server)
    result = CliRunner().invoke(main, ["serve", "--no-default-model", "--ctx", "3072"])
    assert result.exit_code == 0, result.output
    assert seen["plan"].n_ctx == 3072 and seen["plan"].options["ctx_source"] == "--ctx"
    result = CliRunner().invoke(main, ["serve", "--no-default-model"])
    assert seen["plan"].n_ctx == 5120  # without --ctx, the model's own setting
