"""What the Responses API costs over chat completions: the same model and prompt through
``/v1/responses`` and ``/v1/chat/completions`` on one ``localrun serve``.

    python benchmarks/bench_responses.py [--runs 9] [--max-tokens 64] [--threads 2] [--fake]

Both streamed, greedy, a fresh prompt per run (nothing from the prefix cache), the two
routes alternating so a machine's load hits both alike. Per run: TTFT (request sent →
first text delta) and decode rate (text deltas after the first ÷ first-to-last seconds,
each delta one token here). Prints p50 of each route, the TTFT difference (target ≤ 2 ms)
and the decode ratio responses ÷ chat (target ≥ 0.99). Gemma 3 270M by default; ``--fake``
serves the fake runtime instead (tokens cost nothing, so what is left is each route's own
cost per request and per token — a measure that holds on a loaded machine, where a model's
timings swing by more than the 2 ms looked for).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_server import start_localrun  # noqa: E402
from benchmarks.common import free_port, gemma_path, stop, wait_ready  # noqa: E402

PROMPT = "Run {i}: write a short story about a lighthouse keeper who counts ships, and what the sea brings."


def start_fake(home: Path) -> tuple[subprocess.Popen, str]:
    """The fake runtime behind a real server process (the tests' launcher), a tiny GGUF as "gemma"."""
    from tests.factories import write_tiny_llama_gguf

    env = dict(os.environ, LOCALRUN_HOME=str(home), LOCALRUN_RUNTIME__FORCE="fake", PYTHONPATH=str(ROOT))
    model = write_tiny_llama_gguf(home / "tiny.gguf", n_ctx_train=4096)
    subprocess.run(
        [sys.executable, "-m", "localrun", "import", str(model), "--name", "gemma"],
        env=env,
        check=True,
        capture_output=True,
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.launch",
            "--port",
            str(port),
            "--fake-words",
            "1000",
            "--log-level",
            "WARNING",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{url}/health")
    return proc, url


def timed_stream(client, path: str, body: dict, is_text) -> tuple[float, float, int]:
    """(TTFT, first-to-last seconds, text deltas) of one streamed request, read as raw SSE."""
    start = time.perf_counter()
    first = last = None
    n = 0
    with client.stream("POST", path, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if is_text(json.loads(line[6:])):
                last = time.perf_counter()
                first = first or last
                n += 1
    return first - start, last - first, n


def chat_text(event: dict) -> bool:
    choices = event.get("choices") or []
    return bool(choices and (choices[0].get("delta") or {}).get("content"))


def responses_text(event: dict) -> bool:
    return event.get("type") == "response.output_text.delta" and bool(event.get("delta"))


def run(url: str, runs: int, max_tokens: int) -> dict[str, list[tuple[float, float, int]]]:
    import httpx

    samples: dict[str, list] = {"chat": [], "responses": []}
    with httpx.Client(base_url=url, timeout=600) as client:
        for i in range(runs + 1):  # the first pair warms the model up and is not counted
            text = PROMPT.format(i=i)
            chat = {
                "model": "gemma",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
            }
            resp = {
                "model": "gemma",
                "input": text,
                "max_output_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "store": False,
            }
            order = [
                ("chat", "/v1/chat/completions", chat, chat_text),
                ("responses", "/v1/responses", resp, responses_text),
            ]
            if i % 2:
                order.reverse()
            for name, path, body, is_text in order:
                # same prompt for both routes, but fresh for each: a suffix keeps the cache out
                body = json.loads(json.dumps(body).replace(f"Run {i}:", f"Run {i}-{name}:"))
                sample = timed_stream(client, path, body, is_text)
                if i:
                    samples[name].append(sample)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fake", action="store_true", help="the fake runtime: each route's own cost, no model")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-responses-") as home:
        if args.fake:
            proc, url = start_fake(Path(home))
        else:
            proc, url = start_localrun(gemma_path(), Path(home), args.threads)
        try:
            samples = run(url, args.runs, args.max_tokens)
        finally:
            stop(proc)
    p50 = {}
    for name, rows in samples.items():
        ttft = statistics.median(r[0] for r in rows)
        rate = statistics.median((r[2] - 1) / r[1] for r in rows if r[1] > 0 and r[2] > 1)
        p50[name] = (ttft, rate)
        print(f"{name:10s} p50 TTFT {ttft * 1000:8.2f} ms   p50 decode {rate:7.1f} tok/s   ({len(rows)} runs)")
    overhead_ms = (p50["responses"][0] - p50["chat"][0]) * 1000
    ratio = p50["responses"][1] / p50["chat"][1]
    print(f"responses - chat TTFT: {overhead_ms:+.2f} ms (target <= 2 ms)   decode ratio: {ratio:.3f} (target >= 0.99)")
    print(f"load: {os.getloadavg()[0]:.2f} (1 min average)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
