"""The prompts bench_kv_disk.py sends: an agent-shaped prefix built deterministically to a token
count, and Claude Code's own first request, captured at bench time.

* :func:`agent_messages`: a system prompt of agent rules, a JSON list of tools (names,
  descriptions, JSON-schema parameters) written into it as agents' templates do, and a first user
  turn; the same seed gives the same text, so a restarted server sees the same prefix.
* :func:`capture_claude_code`: ``claude -p`` pointed (``ANTHROPIC_BASE_URL``) at a small server in
  this process that records each request and answers with a one-word message, so Claude Code ends
  its turn at once. Its largest request (system prompt, tools, first user turn) is what a new
  session sends first. The text is Claude Code's: it stays in the run's temporary folder and is
  never written into the repository.
* :func:`claude_code_fallback`: the same shape from Claude Code's documented tool list, for a
  machine without npm or network (the report says which one ran).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from benchmarks.common import seeded_words

ROOT = Path(__file__).resolve().parents[1]

WORDS = (
    "read write edit file path line tool call result error test build run check code change diff patch commit "
    "branch review search grep glob list directory function class module import return value type string "
    "number array object schema field option flag command shell output input stream token model context "
    "always never before after when unless user project repository workspace answer plan step task"
).split()

RULES = (
    "You are a coding agent working in the user's repository. Follow these rules in every turn.",
    "Read a file before you edit it; never guess at its contents.",
    "Prefer small, reviewable changes, and run the tests that cover what you changed.",
    "Call one tool at a time and wait for its result before deciding the next step.",
    "Never run commands that delete data or reach the network unless the user asked for it.",
)


def words(n: int, seed: int) -> str:
    """``n`` words from a fixed vocabulary, in sentences of 14; the same seed, the same text."""
    return seeded_words(WORDS, n, seed, capitalize=True)


def tool_specs(count: int, desc_words: int, seed: int) -> list[dict]:
    """OpenAI-style function tools with a JSON-schema of a few typed parameters each."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        props = {
            f"{rng.choice(WORDS)}_{j}": {
                "type": rng.choice(("string", "integer", "boolean")),
                "description": words(8, seed * 1000 + i * 10 + j),
            }
            for j in range(3)
        }
        out.append(
            {
                "type": "function",
                "function": {
                    "name": f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{i}",
                    "description": words(desc_words, seed * 100 + i),
                    "parameters": {"type": "object", "properties": props, "required": sorted(props)[:1]},
                },
            }
        )
    return out


def agent_messages(n_words: int, seed: int = 1, *, tool_count: int | None = None) -> list[dict]:
    """[system, user] of about ``n_words`` words in all: rules and prose, the tools as JSON, a task.
    Tools: one per 300 words, 3 to 24 (an agent's list is about 20; a short prompt gets fewer so
    that every size keeps the same mix of prose and JSON).

    The tools go into the system text, not a ``tools`` field, so llama-server (whose Gemma
    template has no tool syntax) and localrun render the same prompt."""
    tool_count = tool_count or min(24, max(3, n_words // 300))
    prose = max(50, n_words // 2)
    tools = tool_specs(tool_count, max(20, (n_words - prose) // (tool_count * 2)), seed)
    system = "\n".join(RULES) + "\n\n" + words(prose, seed)
    system += "\n\n# Tools\nYou may call these functions:\n" + json.dumps(tools)
    task = "Here is my first request. " + words(200, seed + 7) + "\nStart by listing the files you would read."
    return [{"role": "system", "content": system}, {"role": "user", "content": task}]


def sized_messages(count: Callable[[list[dict]], int], target: int, seed: int = 1) -> tuple[list[dict], int]:
    """:func:`agent_messages` scaled until ``count`` (the server's token count) is near ``target``."""
    # Tokens are a fixed part (rules, schemas, the task) plus a share per word: two small probes
    # (which fit any context) give the line, and each try refits it through the last point.
    points = [(n, count(agent_messages(n, seed))) for n in (300, 600)]
    msgs, have = [], 0
    for _ in range(4):
        (n0, c0), (n1, c1) = points[-2], points[-1]
        # the slope through the last two points, whichever side of the target each fell on
        per_word = max(1e-3, (c1 - c0) / (n1 - n0)) if n1 != n0 else 1.0
        n = max(100, int(n1 + (target - c1) / per_word))
        msgs = agent_messages(n, seed)
        have = count(msgs)
        if abs(have - target) <= max(64, target // 100):
            break
        points.append((n, have))
    return msgs, have


# --- Claude Code -------------------------------------------------------------------------------

CLAUDE_PIN_RE = re.compile(r"@anthropic-ai/claude-code@[0-9][^ \"]*")


def claude_package() -> str:
    """The Claude Code version the suite pins (scripts/dev's AGENT_PACKAGES), so both run the same one."""
    text = (ROOT / "scripts" / "dev").read_text(encoding="utf-8")
    found = CLAUDE_PIN_RE.search(text)
    return found.group(0) if found else "@anthropic-ai/claude-code"


def find_claude(scratch: Path) -> tuple[Path | None, str]:
    """(the ``claude`` binary, where it came from): the suite's install (scripts/dev setup), PATH,
    or a fresh ``npm install`` of the pinned version into ``scratch``; (None, why) when none works."""
    if os.environ.get("CLAUDE_BIN"):
        return Path(os.environ["CLAUDE_BIN"]), "CLAUDE_BIN"
    agents = Path(os.environ.get("LOCALRUN_AGENTS_DIR", ROOT / ".cache" / "npm-agents"))
    if (agents / "node_modules" / ".bin" / "claude").exists():
        return agents / "node_modules" / ".bin" / "claude", str(agents)
    if shutil.which("claude"):
        return Path(shutil.which("claude")), "PATH"
    if not shutil.which("npm"):
        return None, "npm is not installed"
    package = claude_package()
    dest = scratch / "npm"
    dest.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", package],
            cwd=dest,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        return None, f"npm install {package} took over 600 s"
    binary = dest / "node_modules" / ".bin" / "claude"
    if done.returncode or not binary.exists():
        return None, f"npm install {package} failed: {(done.stderr or done.stdout).strip()[-300:]}"
    return binary, f"npm install {package}"


def _answer_sse(model: str) -> bytes:
    """A whole streamed Anthropic message that says "Done." and ends the turn."""
    events = [
        ("message_start", {"type": "message_start", "message": {
            "id": "msg_bench", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "Done."}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 2}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


def _answer_json(model: str) -> dict:
    return {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "Done."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 2},
    }


class _Capture(BaseHTTPRequestHandler):
    bodies: list[dict]  # set on the subclass made per capture

    def log_message(self, *args) -> None:  # quiet: the bench prints its own lines
        pass

    def _send(self, status: int, payload: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._send(200, json.dumps({"data": [], "has_more": False}).encode(), "application/json")

    def do_POST(self) -> None:  # noqa: N802
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?")[0]
        if path.endswith("/count_tokens"):
            self._send(200, json.dumps({"input_tokens": 1000}).encode(), "application/json")
            return
        if path.endswith("/v1/messages"):
            self.bodies.append(body)
            model = str(body.get("model") or "gemma")
            if body.get("stream"):
                self._send(200, _answer_sse(model), "text/event-stream")
            else:
                self._send(200, json.dumps(_answer_json(model)).encode(), "application/json")
            return
        self._send(404, b"{}", "application/json")


FIRST_TASK = "Read README.md and tell me what this project does."


def capture_claude_code(
    claude: Path, scratch: Path, *, model: str = "gemma", timeout: float = 180, task: str = FIRST_TASK
) -> dict:
    """Claude Code's first real request of a new session (its largest: system prompt, tools,
    first user turn ``task``), from ``claude -p`` run headless with HOME and the project in
    ``scratch`` against a capture server. The same ``scratch`` again is the same user's next
    session in the same project (its system prompt names both folders)."""
    bodies: list[dict] = []
    handler = type("Capture", (_Capture,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="claude-capture", daemon=True)
    thread.start()
    home, work = scratch / "claude-home", scratch / "claude-project"
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    (work / "README.md").write_text("# demo\nA small project.\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        ANTHROPIC_BASE_URL=f"http://127.0.0.1:{server.server_address[1]}",
        ANTHROPIC_AUTH_TOKEN="bench",
        ANTHROPIC_MODEL=model,
        ANTHROPIC_SMALL_FAST_MODEL=model,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        CLAUDE_CODE_ATTRIBUTION_HEADER="0",  # as `localrun launch claude` sets it
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_AUTOUPDATER="1",
        NO_COLOR="1",
        CI="1",
    )
    try:
        done = subprocess.run(
            [str(claude), "-p", task],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"claude -p did not end within {timeout:.0f} s") from exc
    finally:
        server.shutdown()
        server.server_close()
    full = [b for b in bodies if b.get("tools")]
    if not full:
        raise RuntimeError(f"claude -p sent no request with tools (exit {done.returncode}): {done.stderr[-300:]!r}")
    body = max(full, key=lambda b: len(json.dumps(b)))
    (scratch / "claude-first-request.json").write_text(json.dumps(body), encoding="utf-8")  # temp only
    return body


# Claude Code's tool names as its documentation lists them (docs.claude.com, "Tools available to Claude").
CLAUDE_TOOLS = (
    "Task", "Bash", "Glob", "Grep", "LS", "ExitPlanMode", "Read", "Edit", "MultiEdit", "Write",
    "NotebookEdit", "WebFetch", "TodoWrite", "WebSearch", "BashOutput", "KillShell", "SlashCommand",
)  # fmt: skip


def claude_code_fallback(system_words: int = 9000, tool_words: int = 350) -> dict:
    """A first request of Claude Code's shape without Claude Code: a long system prompt in text
    blocks, its documented tools with long descriptions and schemas, a first user turn whose
    context comes in a system-reminder block."""
    tools = [
        {
            "name": name,
            "description": words(tool_words, 300 + i),
            "input_schema": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": words(15, 400 + i)},
                    "limit": {"type": "integer", "description": "at most this many"},
                },
                "required": ["path"],
                "additionalProperties": False,
                "$schema": "http://json-schema.org/draft-07/schema#",
            },
        }
        for i, name in enumerate(CLAUDE_TOOLS)
    ]
    system = [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": words(system_words, 2), "cache_control": {"type": "ephemeral"}},
    ]
    reminder = "<system-reminder>\n" + words(400, 3) + "\n</system-reminder>"
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": reminder},
                {"type": "text", "text": "Read README.md and tell me what this project does."},
            ],
        }
    ]
    return {"model": "gemma", "max_tokens": 32000, "system": system, "tools": tools, "messages": messages}
