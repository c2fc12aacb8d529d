"""Claude Code, Codex and opencode as users run them: ``localrun launch AGENT`` with the agent's own
system prompt and its whole default tool list, on Gemma 3 270M at its trained 32k context (the
model whose context holds their first request: Claude Code's is ~20k tokens).

Each test proves the protocol path end to end, not the model's wisdom: the request reaches the
model with the full tool list (the launch log's line for it counts the tools), an answer comes
back, and the agent exits 0. The server ``launch`` starts caps answers (``--max-tokens``), so a base
model that rambles to the agent's own 32k limit cannot take a quarter of an hour. Slow: each
first request is a 10-20k-token prefill, minutes on two cores, so the suite is opt-in: run it with
``-m long`` (pyproject's addopts leaves it out of the default run and CI).
"""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from localrun.cli import main
from tests.agents.conftest import agent_binary, run_launch
from tests.conftest import needs_llama

pytestmark = [
    pytest.mark.long,
    pytest.mark.slow,
    pytest.mark.agents,
    pytest.mark.llama,
    pytest.mark.gemma,
    pytest.mark.timeout(1800),
]

RUN_S = 1500
PROMPT = "Say hello."
ARGS = {
    "claude": ["-p", "--no-session-persistence", PROMPT],
    "codex": ["exec", "--skip-git-repo-check", "--ephemeral", PROMPT],
    "opencode": ["run", PROMPT],
}
#: Fewest tools each agent's default set has (Claude Code ~24, Codex ~8, opencode ~12).
MIN_TOOLS = {"claude": 10, "codex": 3, "opencode": 5}


@needs_llama
@pytest.mark.parametrize("agent", sorted(ARGS))
def test_the_agent_with_its_own_prompt_and_tools_through_launch(
    agent, agents_bin, agent_env, netns, tmp_path, gemma_gguf
):
    agent_binary(agents_bin, agent)
    env = {**agent_env, "LOCALRUN_RUNTIME__THREADS": "2"}
    imported = CliRunner().invoke(main, ["import", str(gemma_gguf), "--name", "gemma3-270m"], env=env)
    assert imported.exit_code == 0, imported.output
    work = tmp_path / "work"
    work.mkdir()
    launch_args = ("--model", "gemma3-270m", "--max-tokens", "64")
    result = run_launch(netns, agent, ARGS[agent], env, work, timeout=RUN_S, launch_args=launch_args)
    out = result.stdout + result.stderr
    found = re.search(r"tail -f (\S+launch-" + agent + r"\.log)", out)
    assert found, out[-4000:]
    log = open(found.group(1), encoding="utf-8").read()
    print("\n".join(line for line in log.splitlines() if "tokens" in line))  # for the run's report (pytest -s)
    assert "localrun serving gemma3-270m (32,768-token context" in out, out[-4000:]
    assert result.returncode == 0, out[-4000:] + log[-4000:]
    tools = [int(n) for n in re.findall(r"gemma3-270m: chat with (\d+) tools of \d+ prompt tokens", log)]
    assert tools and max(tools) >= MIN_TOOLS[agent], log[-4000:]  # the full tool list reached the model
    written = [int(n) for n in re.findall(r"; (\d+) tokens at", log)]
    assert written and max(written) <= 64, log[-4000:]  # the server-side cap held
