"""What issue 14's client features cost, against their anchors, in one run:

    python benchmarks/bench_clients.py [--threads 2] [--rounds 3] [--max-tokens 32] [--parts a,b,c]

(a) OpenAI ``n=4`` on Gemma 3 270M (one prefill, four slots decoding together): wall time ÷
    one ``n=1`` request (target ≤ 1.6), beside four separate requests sent at once and four
    sent one after another. A ~300-token prompt, greedy with ``ignore_eos`` so every choice
    is exactly ``--max-tokens`` long.
(b) ``/tokenize`` of a 10,000-token text over HTTP (target ≤ 20 ms), beside
    llama-cpp-python's ``Llama.tokenize`` on the same vocabulary in this process.
(c) ``/v1/rerank`` of 32 short documents on the tiny reranker fixture: documents per second.

Each server is ``tests.support.launch`` (``localrun serve`` plus test knobs) with a
LOCALRUN_HOME of its own. Report ``uptime`` with the numbers: this box is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port, gemma_path, stop, wait_ready  # noqa: E402

PROMPT = (
    "Here is a long story about a lighthouse keeper who lived on a small island far from the coast. " * 14
).strip()


def start(model: Path, name: str, home: Path, *, threads: int, options: dict) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "LOCALRUN_HOME": str(home), "PYTHONPATH": str(ROOT), "LOCALRUN_RUNTIME__FORCE": ""}
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from localrun.modelstore.store import ModelStore; "
            "from localrun.settings import Settings; ModelStore(Settings()).import_path(sys.argv[1], name=sys.argv[2])",
            str(model),
            name,
        ],
        env=env,
        check=True,
        cwd=ROOT,
    )
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "tests.support.launch",
        "--port",
        str(port),
        "--plan",
        f"n_threads={threads}",
        "--log-level",
        "WARNING",
    ]
    for key, value in options.items():
        args += ["--option", f"{key}={json.dumps(value)}"]
    proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{url}/health")
    return proc, url


def bench_n(url: str, rounds: int, max_tokens: int) -> dict:
    import httpx

    body = {"model": "gemma", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}

    def one(client, **extra) -> float:
        t0 = time.perf_counter()
        r = client.post(f"{url}/v1/completions", json={**body, **extra}, timeout=600)
        r.raise_for_status()
        return time.perf_counter() - t0

    def together(prompt: str) -> float:
        clients = [httpx.Client() for _ in range(4)]
        t0 = time.perf_counter()
        threads = [threading.Thread(target=one, args=(c,), kwargs={"prompt": prompt}) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        for c in clients:
            c.close()
        return wall

    out: dict[str, list[float]] = {"n=1": [], "n=4": [], "4 at once": [], "4 in a row": []}
    with httpx.Client() as client:
        one(client, prompt="warm up", max_tokens=4)
        for r in range(rounds):
            # a fresh prompt per round and case: no case reuses another's cached prefix
            for case in out:
                fresh = {"prompt": f"Round {r} {case}. " + PROMPT}
                if case == "n=1":
                    out[case].append(one(client, **fresh))
                elif case == "n=4":
                    out[case].append(one(client, n=4, **fresh))
                elif case == "4 at once":
                    out[case].append(together(fresh["prompt"]))
                else:
                    out[case].append(sum(one(client, **fresh) for _ in range(4)))
    return {k: statistics.median(v) for k, v in out.items()}


def bench_tokenize(url: str, model: Path, rounds: int) -> dict:
    import httpx
    import llama_cpp

    text = "the quick brown fox jumps over the lazy dog, " * 1000
    with httpx.Client() as client:
        n = len(client.post(f"{url}/tokenize", json={"content": text}).json()["tokens"])
        times = []
        for _ in range(max(10, rounds * 5)):
            t0 = time.perf_counter()
            client.post(f"{url}/tokenize", json={"content": text}).raise_for_status()
            times.append(time.perf_counter() - t0)
    vocab = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    anchor = []
    for _ in range(max(10, rounds * 5)):
        t0 = time.perf_counter()
        vocab.tokenize(text.encode(), add_bos=False, special=True)
        anchor.append(time.perf_counter() - t0)
    return {"tokens": n, "http_ms": statistics.median(times) * 1e3, "in_process_ms": statistics.median(anchor) * 1e3}


def bench_rerank(threads: int, rounds: int) -> dict:
    import httpx
    import numpy as np

    from tests.factories import write_tiny_llama_gguf

    with tempfile.TemporaryDirectory() as tmp:
        head = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
        path = write_tiny_llama_gguf(
            Path(tmp) / "rank.gguf",
            arch="qwen3",
            extra_tensors={"cls.output.weight": head},
            extra_kv={"qwen3.pooling_type": 4, "qwen3.classifier.output_labels": ["yes", "no"]},
        )
        proc, url = start(path, "rank", Path(tmp) / "home", threads=threads, options={})
        try:
            docs = [f"document number {i} about the weather in a small town" for i in range(32)]
            with httpx.Client(timeout=600) as client:
                client.post(f"{url}/rerank", json={"query": "warm", "documents": docs[:2]}).raise_for_status()
                times = []
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    client.post(
                        f"{url}/rerank", json={"query": "weather in town", "documents": docs}
                    ).raise_for_status()
                    times.append(time.perf_counter() - t0)
        finally:
            stop(proc)
    best = statistics.median(times)
    return {"docs": 32, "seconds": best, "docs_per_s": 32 / best}


def report_n(n: dict, args) -> None:
    base = n["n=1"]
    print(f"(a) Gemma, ~300-token prompt, {args.max_tokens} tokens per choice (median of {args.rounds}):")
    for case, wall in n.items():
        print(f"    {case:<11} {wall:7.2f} s   ÷ n=1: {wall / base:5.2f}")
    print(f"    target: n=4 ÷ n=1 ≤ 1.6 -> {'met' if n['n=4'] / base <= 1.6 else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--parts", default="a,b,c", help="which measurements: a (n), b (tokenize), c (rerank)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), threads {args.threads}")
    if parts & {"a", "b"}:
        model = gemma_path()
        with tempfile.TemporaryDirectory() as tmp:
            proc, url = start(model, "gemma", Path(tmp), threads=args.threads, options={"n_slots": 4, "slot_ctx": 1024})
            try:
                if "a" in parts:
                    report_n(bench_n(url, args.rounds, args.max_tokens), args)
                if "b" in parts:
                    tok = bench_tokenize(url, model, args.rounds)
                    print(
                        f"(b) /tokenize {tok['tokens']} tokens: {tok['http_ms']:.1f} ms over HTTP (target ≤ 20), "
                        "llama-cpp-python "
                        f"in process {tok['in_process_ms']:.1f} ms, ratio {tok['http_ms'] / tok['in_process_ms']:.2f}"
                    )
            finally:
                stop(proc)
    if "c" in parts:
        rr = bench_rerank(args.threads, args.rounds)
        print(
            f"(c) /rerank of {rr['docs']} documents on the tiny reranker: {rr['seconds'] * 1e3:.0f} ms, "
            f"{rr['docs_per_s']:.0f} docs/s"
        )
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
