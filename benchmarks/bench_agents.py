"""Coding-agent traffic on ``localrun serve``: the prefix cache across agent turns, and what
the Anthropic route costs over the OpenAI one.

    python benchmarks/bench_agents.py [--system-tokens 15000] [--turns 10] [--runs 5] [--threads 2]

(1) **Agent turns.** A Claude-Code-shaped request through ``/v1/messages`` (streamed): a
system prompt of ``--system-tokens`` tokens in text blocks with ``cache_control``, 24 tools,
``thinking: adaptive``, ``context_management``, ``metadata``; then ``--turns`` turns, each
re-sending everything plus the model's last answer and a new user message of a few hundred
tokens. Per turn: TTFT (to the first content delta) ÷ the cold first turn's (target ≤ 0.05),
and the share of the prompt read from the prefix cache (``cache_read_input_tokens``, target
≥ 95 %). Twice: with Claude Code's per-request billing line (``cch=`` changes every request;
localrun rewrites it) and without it.

(2) **Route overhead.** The same model and prompt through ``/v1/messages`` and
``/v1/chat/completions``, streamed, greedy, a fresh prompt per run, the two routes
alternating: p50 TTFT difference (target ≤ 2 ms) and decode tok/s ratio (target ≥ 0.99).

The model is Gemma 3 270M (its 32k context holds the agent conversation; SmolLM2's 8k does
not). One server, one slot, ``--threads`` threads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port, gemma_path, seeded_words, stop, wait_ready  # noqa: E402

WORDS = (
    "read write edit file path line tool call result error test build run check code change diff patch commit "
    "branch review search grep glob list directory function class module import return value type string "
    "number array object schema field option flag command shell output input stream token model context"
).split()


def words(n: int, seed: int) -> str:
    return seeded_words(WORDS, n, seed)


def tools(n: int = 24) -> list[dict]:
    return [
        {
            "name": f"Tool{i}",
            "description": words(60, 100 + i),
            "input_schema": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "a file path"}, "limit": {"type": "integer"}},
                "required": ["path"],
            },
        }
        for i in range(n)
    ]


def system_blocks(n_words: int, billing: bool, turn: int) -> list[dict]:
    blocks = []
    if billing:  # Claude Code's first block: its cch value changes on every request
        blocks.append(
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=cli; "
                f"cch={random.Random(turn).getrandbits(20):05x};",
            }
        )
    blocks.append(
        {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks."}
    )
    blocks.append({"type": "text", "text": words(n_words, 1), "cache_control": {"type": "ephemeral"}})
    return blocks


def stream_messages(client, url: str, body: dict) -> tuple[float, dict, str, float, int]:
    """(ttft s, final usage, answer text, decode s, deltas) of one streamed /v1/messages request."""
    t0 = time.perf_counter()
    first = last = None
    usage, text, n = {}, [], 0
    with client.stream("POST", f"{url}/v1/messages", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "content_block_delta":
                now = time.perf_counter()
                first = first or now
                last = now
                n += 1
                text.append(event["delta"].get("text", ""))
            elif event["type"] == "message_delta":
                usage = event["usage"]
    return (first or time.perf_counter()) - t0, usage, "".join(text), (last or 0) - (first or 0), n


def stream_chat(client, url: str, body: dict) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    first = last = None
    n = 0
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:])["choices"]
            if choices and choices[0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                n += 1
    return (first or time.perf_counter()) - t0, (last or 0) - (first or 0), n


def agent_turns(
    client, url: str, model: str, system_words: int, turns: int, billing: bool
) -> list[tuple[float, float]]:
    """(ttft s, cached share) per turn, the cold first turn first."""
    messages = [{"role": "user", "content": words(250, 1000)}]
    out = []
    for turn in range(turns + 1):
        body = {
            "model": model,
            "max_tokens": 12,
            "temperature": 0,
            "stream": True,
            "system": system_blocks(system_words, billing, turn),
            "tools": tools(),
            "messages": messages,
            "thinking": {"type": "adaptive"},
            "metadata": {"user_id": "bench"},
            "context_management": {"edits": []},
        }
        ttft, usage, answer, _, _ = stream_messages(client, url, body)
        total = usage["input_tokens"] + usage["cache_read_input_tokens"]
        out.append((ttft, usage["cache_read_input_tokens"] / total if total else 0.0))
        print(
            f"  turn {turn:2d}: prompt {total:6d} tokens, TTFT {ttft * 1000:8.1f} ms, cached {out[-1][1]:6.1%}",
            flush=True,
        )
        messages = messages + [
            {"role": "assistant", "content": answer or "ok"},
            {"role": "user", "content": words(250, 2000 + turn)},
        ]
    return out


def overhead(client, url: str, model: str, runs: int, max_tokens: int) -> None:
    msgs, chat = [], []
    for i in range(runs + 1):  # the first pair warms up
        prompt = f"Run {i}. " + words(60, 5000 + i)
        m = stream_messages(
            client,
            url,
            {
                "model": model,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "messages": [{"role": "user", "content": prompt}],
            },
        )
        prompt2 = f"Run {i}b. " + words(60, 5000 + i)  # the same length, not a cached prefix of the first
        c = stream_chat(
            client,
            url,
            {
                "model": model,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "messages": [{"role": "user", "content": prompt2}],
            },
        )
        if i:
            msgs.append((m[0], m[3], m[4]))
            chat.append(c)
    ttft_m = statistics.median(s[0] for s in msgs)
    ttft_c = statistics.median(s[0] for s in chat)
    rate_m = statistics.median((s[2] - 1) / s[1] for s in msgs if s[1] > 0 and s[2] > 1)
    rate_c = statistics.median((s[2] - 1) / s[1] for s in chat if s[1] > 0 and s[2] > 1)
    print(
        f"route overhead ({runs} runs, p50): TTFT /v1/messages {ttft_m * 1000:.1f} ms vs /v1/chat/completions "
        f"{ttft_c * 1000:.1f} ms (diff {(ttft_m - ttft_c) * 1000:+.1f} ms, target <= 2); decode {rate_m:.1f} vs "
        f"{rate_c:.1f} tok/s (ratio {rate_m / rate_c:.3f}, target >= 0.99)"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system-tokens", type=int, default=15000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-turns", action="store_true", help="measure only the route overhead")
    args = parser.parse_args()
    import httpx

    model = gemma_path()
    n_ctx = max(4096, args.system_tokens + 4000 + args.turns * 700)
    home = tempfile.mkdtemp(prefix="bench-agents-")
    env = {**os.environ, "LOCALRUN_HOME": home, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "localrun", "import", str(model), "--name", "gemma"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.launch",
            "--port",
            str(port),
            "--log-level",
            "WARNING",
            "--plan",
            f"n_ctx={n_ctx}",
            "--plan",
            f"n_threads={args.threads}",
            "--option",
            "n_slots=1",
            "--option",
            f"slot_ctx={n_ctx}",
        ],
        env=env,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, f"{url}/health")
        with httpx.Client(timeout=1800) as client:
            # words per token for this tokenizer, from the server's own count
            sample = client.post(
                f"{url}/v1/messages/count_tokens",
                json={"model": "gemma", "system": words(2000, 1), "messages": [{"role": "user", "content": "x"}]},
            )
            per_word = sample.json()["input_tokens"] / 2000
            system_words = int(args.system_tokens / per_word)
            print(f"load: {os.getloadavg()[0]:.2f} (1 min); model {model.name}, n_ctx {n_ctx}, threads {args.threads}")
            for billing in () if args.skip_turns else (True, False):
                print(f"agent turns, {'with' if billing else 'without'} the per-request billing line:")
                res = agent_turns(client, url, "gemma", system_words, args.turns, billing)
                cold = res[0][0]
                ratios = [t / cold for t, _ in res[1:]]
                cached = [c for _, c in res[1:]]
                print(
                    f"  turn-k TTFT / cold: p50 {statistics.median(ratios):.3f}, max {max(ratios):.3f} (target <= "
                    "0.05); "
                    f"cached: min {min(cached):.1%} (target >= 95%)"
                )
            overhead(client, url, "gemma", args.runs, args.max_tokens)
    finally:
        stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
