"""Real coding agents, headless, against ``localrun launch``: Claude Code (``claude -p``),
Codex (``codex exec``) and opencode (``opencode run``).

Per agent, two runs; each checks the protocol round trip, not the model's wisdom:

* one turn on a real llama.cpp model (SmolLM2 135M Instruct, the default chat model):
  ``localrun launch`` starts its own server, the agent gets an answer and exits 0;
* a tool-using task on the scripted runtime (a tiny model will not call a tool on cue):
  a server is already running and ``launch`` reuses it; the agent is told to call one of
  its own tools, runs it (reading a file with a fresh marker), sends the result back, and
  prints the answer that quotes it — so the marker in the agent's output proves the call,
  the run and the result's way back.

The one-turn runs keep each agent's prompt short (Claude Code's ``--bare`` and its own
system prompt, opencode's project config without tools; Codex as launched, ~4.5k tokens),
cap answers at 160 tokens and make them greedy (the server's ``runtime.force_temperature``), so
a run's answer is the same every time; their time is prefill on two cores.
"""

from __future__ import annotations

import secrets

import pytest

from tests.agents.conftest import agent_binary, run_launch
from tests.conftest import needs_llama

pytestmark = [pytest.mark.agents, pytest.mark.timeout(1200)]

RUN_S = 900  # one agent run's limit on a loaded machine; a quiet one takes seconds


def _check(result, *expected: str) -> str:
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    for text in expected:
        assert text in out, out[-4000:]
    return out


def _short(env: dict, tokens: int) -> dict:
    """Answers capped at ``tokens``, and greedy whatever the agent asks (``runtime.force_temperature``):
    agents sample (Claude Code at temperature 1), and a sampled SmolLM2 now and then rambled past any
    cap, so Codex stopped on max_output_tokens and Claude Code gave up after answers cut short."""
    return {
        **env,
        "LOCALRUN_RUNTIME__MAX_TOKENS_CAP": str(tokens),
        "LOCALRUN_RUNTIME__FORCE_TEMPERATURE": "0",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(tokens),
    }


ONE_TURN = {
    "claude": [
        "-p",
        "--bare",
        "--system-prompt",
        "Answer in one short sentence.",
        "--tools",
        "",
        "--no-session-persistence",
        "Say hello.",
    ],
    "codex": ["exec", "--skip-git-repo-check", "--ephemeral", "Say hello."],
    "opencode": ["run", "Say hello."],
}
OPENCODE_PROJECT = (
    '{"$schema": "https://opencode.ai/config.json", "tools": {"*": false}, '
    '"agent": {"build": {"prompt": "Answer in one short sentence."}}}'
)


@needs_llama
@pytest.mark.llama
@pytest.mark.parametrize("agent", sorted(ONE_TURN))
def test_one_turn_on_a_real_model(agent, agents_bin, agent_env, netns, tmp_path, smollm2_path):
    agent_binary(agents_bin, agent)
    work = tmp_path / "work"
    work.mkdir()
    if agent == "opencode":
        (work / "opencode.json").write_text(OPENCODE_PROJECT)
    # the chat model by name: without --model, launch now picks the model whose context holds the agent's
    # first request (the base Gemma here, which rambles to the cap): tests/agents/test_launch_choice.py
    result = run_launch(
        netns,
        agent,
        ONE_TURN[agent],
        _short(agent_env, 160),
        work,
        timeout=RUN_S,
        launch_args=("--model", "smollm2-135m-instruct"),
    )
    out = _check(result, "localrun serving smollm2-135m-instruct")
    route = {"claude": '"POST /v1/messages', "codex": '"POST /v1/responses', "opencode": '"POST /v1/chat/completions'}[
        agent
    ]
    assert f"{route}" in out and "model=smollm2-135m-instruct" in out, out[-4000:]


def _marker(work) -> tuple[str, str]:
    marker = f"localrun-tool-ok-{secrets.token_hex(4)}"
    path = work / "marker.txt"
    path.write_text(marker + "\n")
    return marker, str(path)


TOOL_TASK = {
    "claude": [
        "-p",
        "--bare",
        "--tools",
        "Read",
        "--allowedTools",
        "Read",
        "--no-session-persistence",
        "Read marker.txt.",
    ],
    "codex": ["exec", "--skip-git-repo-check", "--ephemeral", "Show me marker.txt."],
    "opencode": ["run", "Read marker.txt."],
}


def _script(agent: str, path: str) -> dict:
    return {
        "claude": {"Read": {"file_path": path}},
        "codex": {
            "exec_command": {"cmd": f"cat {path}"},
            "shell_command": {"command": f"cat {path}"},
            "shell": {"command": ["cat", path]},
        },
        "opencode": {"read": {"filePath": path}},
    }[agent]


@pytest.mark.parametrize("agent", sorted(TOOL_TASK))
def test_a_tool_call_round_trip(agent, agents_bin, agent_env, netns, tmp_path, scripted_server):
    agent_binary(agents_bin, agent)
    work = tmp_path / "work"
    work.mkdir()
    marker, path = _marker(work)
    server = scripted_server(netns, agent_env, _script(agent, path))
    env = {**agent_env, "LOCALRUN_SERVER__PORT": str(server.port)}
    result = run_launch(netns, agent, TOOL_TASK[agent], env, work, timeout=RUN_S, launch_args=("--model", "tiny"))
    out = _check(result, "using the localrun server", "The tool said:")
    assert marker in out.split("The tool said:", 1)[1], out[-4000:]  # the file's text came back through the model
    answered = [line for line in server.log_text().splitlines() if '"POST /v1/' in line and '" 200 ' in line]
    assert len(answered) >= 2, server.log_text()[-3000:]  # the call, then the answer to its result
