"""Upstreams: what routing through localrun costs, and what prefix affinity buys.

    python benchmarks/bench_upstream.py [--runs 6] [--max-tokens 48] [--threads 1]

Part 1, overhead. One upstream (a localrun server running Gemma 3 270M on llama.cpp) and a
front localrun whose only model is that upstream's. The same greedy prompts go straight to
the upstream and through the front, alternating, at 1 and 8 concurrent streams; printed:
p50 time to first token of each and the difference (target ≤ 3 ms), and the decode rate
through localrun over the direct one (target ≥ 0.98).

Part 2, prefix affinity. Two upstreams, a 10-turn conversation whose system prompt is a
~2,000-token shared prefix. Once through a front with ``least-loaded`` routing, once with
``prefix-affinity`` (a fresh prefix each time, so both start cold); printed: the prompt
tokens the upstreams served from their prefix caches (``usage.prompt_tokens_details.
cached_tokens``) in each mode.
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
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port, gemma_path, stop, wait_ready  # noqa: E402

N_CTX = 4096
WORDS = "river stone lamp orchard violin harbor meadow lantern copper thistle glacier ember canyon willow".split()


def start_server(
    home: Path, *, threads: int, config: str = "", model: Path | None = None, fake_delay_s: float | None = None
) -> tuple[subprocess.Popen, str]:
    """A ``localrun serve`` under ``home``: an upstream (``model`` imported as "gemma") or a front (``config``).

    ``fake_delay_s``: the upstream runs the fake runtime (a token every that many seconds, no
    compute), which shows what the front itself costs when it does not compete for the CPU.
    """
    home.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        LOCALRUN_HOME=str(home),
        LOCALRUN_RUNTIME__THREADS=str(threads),
        LOCALRUN_RUNTIME__CONTEXT_LENGTH=str(N_CTX),
        LOCALRUN_SERVER__QUEUE_SIZE="64",
        PYTHONPATH=str(ROOT),
    )
    env.pop("LOCALRUN_RUNTIME__FORCE", None)
    if config:
        (home / "config.toml").write_text(config)
    if model is not None:
        subprocess.run(
            [sys.executable, "-m", "localrun", "import", str(model), "--name", "gemma"],
            env=env,
            check=True,
            capture_output=True,
        )
    port = free_port()
    cmd = [sys.executable, "-m", "localrun", "serve", "--no-default-model", "--port", str(port)]
    if fake_delay_s is not None:
        env["LOCALRUN_RUNTIME__FORCE"] = "fake"
        cmd = [
            sys.executable,
            "-m",
            "tests.support.launch",
            "--port",
            str(port),
            "--fake-delay",
            str(fake_delay_s),
            "--log-level",
            "WARNING",
        ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{url}/health")
    return proc, url


def front_config(urls: list[str], routing: str) -> str:
    ups = "".join(f'\n[[upstreams]]\nname = "u{i}"\nurl = "{u}"\nkind = "localrun"\n' for i, u in enumerate(urls))
    return f'[upstream]\nrouting = "{routing}"\nprobe_interval_s = 2.0\n{ups}'


def stream(client: httpx.Client, url: str, body: dict) -> dict:
    """One streamed chat: TTFT, decode rate over the text chunks, and the usage event."""
    start = time.perf_counter()
    first = last = None
    chunks = 0
    usage: dict = {}
    with client.stream(
        "POST", f"{url}/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            choices = event.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                last = time.perf_counter()
                first = first or last
                chunks += 1
    tokens = usage.get("completion_tokens") or chunks
    rate = (tokens - 1) / (last - first) if first and last and last > first and tokens > 1 else None
    return {"ttft": first - start if first else None, "rate": rate, "usage": usage}


def chat(prompt: str, max_tokens: int) -> dict:
    return {
        "model": "gemma",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
    }


def overhead(direct: str, front: str, *, level: int, runs: int, max_tokens: int) -> dict:
    """Paired rounds: ``level`` streams straight to the upstream, then the same prompts through localrun."""
    samples: dict[str, list[dict]] = {"direct": [], "via": []}
    with httpx.Client(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        for run in range(runs):
            prompts = [
                f"Write one sentence about the {WORDS[(run * level + k) % len(WORDS)]} (#{run}-{k})."
                for k in range(level)
            ]
            order = [("direct", direct), ("via", front)] if run % 2 == 0 else [("via", front), ("direct", direct)]
            for tag, url in order:
                results: list[dict] = []
                threads = [
                    threading.Thread(
                        target=lambda p=p, results=results, url=url: results.append(
                            stream(client, url, chat(p, max_tokens))
                        )
                    )
                    for p in prompts
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                samples[tag].extend(results)
    med = {
        tag: (statistics.median(s["ttft"] for s in rs), statistics.median(s["rate"] for s in rs if s["rate"]))
        for tag, rs in samples.items()
    }
    return {
        "level": level,
        "ttft_direct_ms": med["direct"][0] * 1000,
        "ttft_via_ms": med["via"][0] * 1000,
        "overhead_ms": (med["via"][0] - med["direct"][0]) * 1000,
        "decode_ratio": med["via"][1] / med["direct"][1],
        "rate_direct": med["direct"][1],
        "rate_via": med["via"][1],
        "n": len(samples["via"]),
    }


def overhead_table(direct: str, front: str, args) -> None:
    print(
        f"{'streams':>7} {'TTFT direct':>12} {'TTFT via':>10} {'overhead':>9} {'tok/s direct':>13} {'tok/s via':>10} "
        f"{'ratio':>6}"
    )
    for level in (1, 8):
        r = overhead(direct, front, level=level, runs=args.runs, max_tokens=args.max_tokens)
        print(
            f"{level:>7} {r['ttft_direct_ms']:>10.1f}ms {r['ttft_via_ms']:>8.1f}ms {r['overhead_ms']:>+7.1f}ms "
            f"{r['rate_direct']:>13.1f} {r['rate_via']:>10.1f} {r['decode_ratio']:>6.3f}"
        )


def conversation(front: str, *, seed: int, turns: int = 10) -> tuple[int, int]:
    """A 10-turn chat behind a ~2,000-token system prompt; (cached prompt tokens, prompt tokens) summed."""
    rng = random.Random(seed)
    prefix = "You are a careful assistant. Reference notes follow. " + " ".join(rng.choice(WORDS) for _ in range(1900))
    messages = [{"role": "system", "content": prefix}]
    cached = total = 0
    with httpx.Client(timeout=600) as client:
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Question {turn}: name one word from the notes."})
            out = stream(client, front, {"model": "gemma", "messages": messages, "max_tokens": 12, "temperature": 0})
            usage = out["usage"]
            cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            total += usage.get("prompt_tokens") or 0
            messages.append({"role": "assistant", "content": "ok"})
    return cached, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads per upstream")
    ap.add_argument("--skip-affinity", action="store_true")
    args = ap.parse_args()
    model = gemma_path()
    print(
        f"load {os.getloadavg()[0]:.2f} · model {model.name} · n_ctx {N_CTX} · greedy · {args.threads} thread(s) per "
        "upstream"
    )
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="bench-upstream-") as tmp:
        try:
            up0, url0 = start_server(Path(tmp) / "up0", threads=args.threads, model=model)
            procs.append(up0)
            front, front_url = start_server(Path(tmp) / "front", threads=1, config=front_config([url0], "least-loaded"))
            procs.append(front)
            for s in (url0, front_url):  # load the model and warm both paths
                stream(httpx.Client(timeout=600), s, chat("warm up", 8))
            print("\nthrough localrun vs straight to the upstream, Gemma on llama.cpp (p50 over paired rounds)")
            overhead_table(url0, front_url, args)
            fake, fake_url = start_server(Path(tmp) / "fake", threads=1, model=model, fake_delay_s=0.01)
            procs.append(fake)
            ffront, ffront_url = start_server(
                Path(tmp) / "ffront", threads=1, config=front_config([fake_url], "least-loaded")
            )
            procs.append(ffront)
            stream(httpx.Client(timeout=600), ffront_url, chat("warm up", 8))
            print("\nthe same, upstream on the fake runtime (a token per 10 ms, no compute: the front's own cost)")
            overhead_table(fake_url, ffront_url, args)
            if args.skip_affinity:
                return
            up1, url1 = start_server(Path(tmp) / "up1", threads=args.threads, model=model)
            procs.append(up1)
            stream(httpx.Client(timeout=600), url1, chat("warm up", 8))
            print("\nprefix affinity: 10 turns behind a ~2,000-token system prompt, two upstreams")
            for i, routing in enumerate(("least-loaded", "prefix-affinity")):
                fp, furl = start_server(
                    Path(tmp) / f"front-{routing}", threads=1, config=front_config([url0, url1], routing)
                )
                procs.append(fp)
                cached, total = conversation(furl, seed=100 + i)
                print(f"{routing:>16}: cached prompt tokens {cached:,} of {total:,} ({cached / max(total, 1):.0%})")
        finally:
            for p in procs:
                stop(p)
    print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
