"""``localrun launch``'s own behaviour, without running an agent: the settings it prints,
what it says when an agent is missing or unknown, and the context it asks for."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

from click.testing import CliRunner

from localrun.cli import main
from localrun.cli.launch import AGENTS, Endpoint, codex_catalog, context_notes, opencode_config
from localrun.types import Format, ModelRecord, Plan
from tests.support.launch import REPO


def launch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "localrun", "launch", *args], env=full, capture_output=True, text=True, timeout=120
    )


def test_print_shows_each_agents_settings_and_writes_no_user_config(tiny_gguf, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    runner = CliRunner()
    assert runner.invoke(main, ["import", str(tiny_gguf), "--name", "tiny"]).exit_code == 0
    claude = runner.invoke(main, ["launch", "--model", "tiny", "--print", "claude"], env={"HOME": str(home)})
    assert claude.exit_code == 0, claude.output
    assert "export ANTHROPIC_BASE_URL=http://127.0.0.1:8739\n" in claude.output  # no /v1: Claude Code adds it
    for var in (
        "ANTHROPIC_AUTH_TOKEN=localrun",
        "ANTHROPIC_DEFAULT_SONNET_MODEL=tiny",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL=tiny",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
        "CLAUDE_CODE_ATTRIBUTION_HEADER=0",
        "unset ANTHROPIC_API_KEY",
    ):
        assert var in claude.output, var
    codex = runner.invoke(
        main, ["launch", "--model", "tiny", "--print", "codex", "exec", "hi"], env={"HOME": str(home)}
    )
    assert codex.exit_code == 0, codex.output
    command = shlex.split(codex.output.strip().splitlines()[-1])
    assert command[0] == "codex" and command[-2:] == ["exec", "hi"]
    overrides = dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "-c")
    assert overrides["model_providers.localrun.wire_api"] == '"responses"'
    assert overrides["model_providers.localrun.base_url"] == '"http://127.0.0.1:8739/v1"'
    catalog = json.loads(open(json.loads(overrides["model_catalog_json"])).read())
    assert catalog["models"][0]["slug"] == "tiny"
    opencode = runner.invoke(main, ["launch", "--model", "tiny", "--print", "opencode"], env={"HOME": str(home)})
    assert "OPENCODE_CONFIG_CONTENT=" in opencode.output
    assert not any(home.iterdir())  # nothing of the user's own configuration was written


def test_a_missing_agent_says_how_to_install_it(tiny_gguf, tmp_path):
    CliRunner().invoke(main, ["import", str(tiny_gguf), "--name", "tiny"])
    result = launch("claude", "--model", "tiny", env={"PATH": str(tmp_path)})
    assert result.returncode == 127, result.stderr
    assert "claude is not installed" in result.stderr and "npm install -g @anthropic-ai/claude-code" in result.stderr
    unknown = launch("vim")
    assert unknown.returncode != 0 and "claude, codex, opencode" in unknown.stderr


def test_the_context_is_sized_for_the_agent_or_the_reason_is_said():
    agent = AGENTS["claude"]
    record = ModelRecord("small", Format.GGUF, "/x.gguf", metadata={"context_length": 8192})
    notes = context_notes(agent, record, Plan(runtime="llama.cpp", n_ctx=8192))
    assert len(notes) == 1 and "trained on 8,192 tokens" in notes[0] and "20,100" in notes[0]
    big = ModelRecord("big", Format.GGUF, "/x.gguf", metadata={"context_length": 131072})
    assert context_notes(agent, big, Plan(runtime="llama.cpp", n_ctx=agent.context)) == []
    squeezed = context_notes(
        agent, big, Plan(runtime="llama.cpp", n_ctx=4096, reasons=("context reduced to fit in memory",))
    )
    assert "reduced to fit in memory" in squeezed[0]
    e = Endpoint("http://127.0.0.1:1", "k", "m", 32768)
    assert codex_catalog(e)["models"][0]["context_window"] == 32768
    assert opencode_config(e)["provider"]["localrun"]["models"]["m"]["limit"]["context"] == 32768
