"""Each agent's real first request — its own system prompt and whole default tool list — is one
localrun takes: the agent (Claude Code, Codex, opencode, at the versions set-up pins) is run with
``launch``'s own settings against a server that only records the request, and the recorded body is
then sent to localrun (the fake runtime; every schema and grammar check runs before any runtime).

Claude Code 2.1.197's tools carry ``propertyNames: {"type": "string"}`` and ``maxLength: 524288``;
both were a 400 from the schema check on every model, so the agent could not take one turn. An
agent update that brings a keyword the grammar cannot keep fails here, not in a user's first hour.
"""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from localrun.cli.launch import AGENTS, TELEMETRY_OFF, Endpoint
from localrun.server.app import create_app
from localrun.types import Plan
from tests.agents.conftest import agent_binary
from tests.support.capabilities import ALL

pytestmark = [pytest.mark.agents]

#: One headless turn per agent, and the route its first real turn goes to.
RUNS = {
    "claude": (["-p", "--no-session-persistence", "Say hello."], "/v1/messages"),
    "codex": (["exec", "--skip-git-repo-check", "--ephemeral", "Say hello."], "/v1/responses"),
    "opencode": (["run", "Say hello."], "/v1/chat/completions"),
}


class _Recorder(BaseHTTPRequestHandler):
    """Keeps every POST body by path and refuses it (the agents then give up at once)."""

    bodies: dict[str, list[dict]] = {}

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(404)
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?")[0]
        try:
            self.bodies.setdefault(path, []).append(json.loads(body))
        except ValueError:
            pass
        payload = b'{"type":"error","error":{"type":"invalid_request_error","message":"recorded"}}'
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder():
    _Recorder.bodies = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, _Recorder.bodies
    server.shutdown()
    server.server_close()


def _first_turn(bodies: dict[str, list[dict]], route: str) -> dict:
    """The first request that carries tools (Claude Code asks for a title first, without them)."""
    found = [b for b in bodies.get(route, []) if b.get("tools")]
    assert found, f"no request with tools reached {route}: {sorted(bodies)}"
    return found[0]


@pytest.mark.parametrize("agent", sorted(RUNS))
def test_the_agents_own_first_request_passes_every_schema_check(
    agent, agents_bin, agent_env, recorder, build_stack, tmp_path
):
    binary = agent_binary(agents_bin, agent)
    server, bodies = recorder
    url = f"http://127.0.0.1:{server.server_address[1]}"
    args, route = RUNS[agent]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    extra, arguments = AGENTS[agent].settings(Endpoint(url, "test-key-1234", "tiny", 32_768), Path(scratch))
    env = {**agent_env, **TELEMETRY_OFF, **extra, "PWD": str(work)}
    done = subprocess.run(
        [str(binary), *arguments, *args],
        env=env,
        cwd=work,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    body = _first_turn(bodies, route)
    assert len(body["tools"]) >= 3, done.stdout[-2000:] + done.stderr[-2000:]
    body["model"] = "tiny"
    body.pop("max_output_tokens" if route == "/v1/responses" else "max_tokens", None)
    if route == "/v1/responses":
        body["max_output_tokens"] = 16
    else:
        body["max_tokens"] = 16
    stack = build_stack(planner=lambda record: Plan(runtime="fake", n_ctx=65_536, options={"fake_capabilities": ALL}))
    with TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost") as client:
        answer = client.post(route, json=body)
    assert answer.status_code == 200, (len(body["tools"]), answer.text[:2000])
