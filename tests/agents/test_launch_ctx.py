"""``launch --ctx`` and what ``launch`` shows while the agent waits: the log file it names gets one line
per request (prompt tokens, time to first token, tokens per second), the prefill progress of a long
prompt from the llama.cpp worker, and why a request was refused. A stand-in agent (a small Python
script named ``claude`` on PATH) sends the requests, so this runs in seconds on the tiny model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from localrun.cli import main
from tests.conftest import needs_llama
from tests.support.launch import REPO
from tests.support.servers import free_port

AGENT = textwrap.dedent(
    """\
    #!{python}
    import os, httpx
    url, key = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_AUTH_TOKEN"]
    model = os.environ["ANTHROPIC_MODEL"]
    def ask(text, max_tokens=4):
        r = httpx.post(f"{{url}}/v1/messages", headers={{"x-api-key": key}}, timeout=120, json={{
            "model": model, "max_tokens": max_tokens, "messages": [{{"role": "user", "content": text}}]}})
        print(r.status_code, r.text[:300])
    ask("hello")
    ask(" ".join(["token"] * {long}))
    ask(" ".join(["token"] * {too_long}))
    ask("hello", max_tokens=100000)
    """
)


def _print(*args, env=None):
    return CliRunner().invoke(main, ["launch", *args], env=env)


def test_launch_ctx_and_the_users_ctx_settings_size_the_agents_context(tiny_gguf_long, tmp_path, monkeypatch):
    assert CliRunner().invoke(main, ["import", str(tiny_gguf_long), "--name", "tiny"]).exit_code == 0
    default = _print("--model", "tiny", "--print", "claude")
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW=32768" in default.output, default.output
    asked = _print("--model", "tiny", "--ctx", "16384", "--print", "claude")
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW=16384" in asked.output, asked.output
    cfg = tmp_path / "config.toml"
    cfg.write_text('[models."tiny"]\nctx = 24576\n')
    monkeypatch.setenv("LOCALRUN_CONFIG", str(cfg))
    configured = _print("--model", "tiny", "--print", "claude")
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW=24576" in configured.output, configured.output
    assert (
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW=8192" in _print("--model", "tiny", "--ctx", "8192", "--print", "claude").output
    )


@needs_llama
@pytest.mark.llama
def test_launch_names_a_log_of_what_the_server_does(tiny_gguf_long, tmp_path):
    assert CliRunner().invoke(main, ["import", str(tiny_gguf_long), "--name", "tiny"]).exit_code == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "claude"
    agent.write_text(AGENT.format(python=sys.executable, long=700, too_long=2000))
    agent.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "LOCALRUN_SERVER__PORT": str(free_port()),
        "LOCALRUN_RUNTIME__THREADS": "1",
    }
    cmd = [sys.executable, "-m", "localrun", "launch", "claude", "--model", "tiny", "--ctx", "4096"]
    cmd += ["--max-tokens", "16"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"tail -f (\S+launch-claude\.log)", result.stderr)
    assert found, result.stderr
    statuses = [line.split()[0] for line in result.stdout.splitlines()]
    assert statuses == ["200", "200", "400", "200"], result.stdout
    log = open(found.group(1), encoding="utf-8").read()
    assert re.search(r"tiny: chat of \d+ prompt tokens \(context 4096\): first token after [\d.]+ s, \d+ tok/s", log), (
        log
    )
    assert re.search(r"prefill \d+/\d+ tokens \(\d+%\), \d+ tok/s", log), log  # the worker's progress
    assert "refused: the prompt is" in log and "start the server with --ctx" in log, log
    # the agent asked for 100,000 tokens: the server launch started wrote at most 16
    written = [int(n) for n in re.findall(r"; (\d+) tokens at", log)]
    assert len(written) == 3 and max(written) <= 16, log
