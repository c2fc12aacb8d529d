"""``localrun run`` loads for the one person at the terminal: one slot (not the server's four, each
with the whole context) and no prompt-cache tiers it will not use; it says how long the load took
apart from the first token; with a model that has no chat template it says how long it will
complete, and ``--max-tokens`` changes that."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from localrun.cli import main
from localrun.manager import ModelManager
from tests.conftest import needs_llama


@pytest.fixture
def started_plans(monkeypatch):
    plans = []
    real = ModelManager.start_handle

    def spy(self, record, plan):
        handle = real(self, record, plan)
        plans.append((plan, self.settings.cache))
        return handle

    monkeypatch.setattr(ModelManager, "start_handle", spy)
    return plans


def _lr(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@needs_llama
def test_run_loads_one_slot_and_no_prompt_cache(tiny_gguf, started_plans, monkeypatch):
    monkeypatch.setenv("LOCALRUN_RUNTIME__THREADS", "1")
    _lr("import", str(tiny_gguf), "--name", "tiny")
    out = _lr("run", "tiny", "hello", "--max-tokens", "2", "--temperature", "0")
    ((plan, cache),) = started_plans
    assert plan.options["n_slots"] == 1
    assert plan.options["kv_ram_bytes"] == 0 and cache.kv_ram_bytes == 0 and cache.kv_disk_bytes == 0
    assert "load " in out.stderr and "first token" in out.stderr  # the load, apart from the first token
    _lr("run", "tiny", "hello", "--max-tokens", "2", "--parallel", "2")
    assert started_plans[1][0].options["n_slots"] == 2  # --parallel still asks for more


@needs_llama
def test_run_states_the_completion_default_and_max_tokens_changes_it(tiny_gguf_no_template, monkeypatch):
    monkeypatch.setenv("LOCALRUN_RUNTIME__THREADS", "1")
    monkeypatch.setenv("LOCALRUN_RUNTIME__COMPLETION_MAX_TOKENS", "6")
    _lr("import", str(tiny_gguf_no_template), "--name", "base")
    out = _lr("run", "base", "The capital of France is", "--temperature", "0")
    assert "no chat template: completing up to 6 tokens; --max-tokens changes it" in out.stderr
    assert "6 tokens" in out.stderr.splitlines()[-1]
    out = _lr("run", "base", "The capital of France is", "--temperature", "0", "--max-tokens", "3")
    assert "no chat template" not in out.stderr and "3 tokens" in out.stderr
