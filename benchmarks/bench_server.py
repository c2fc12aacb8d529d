"""Serving overhead: Gemma 3 270M through ``localrun serve`` against llama-cpp-python in-process.

    python benchmarks/bench_server.py [--runs 5] [--max-tokens 128] [--threads 2] [--concurrency 1,2,4,8]

Single stream, same model file, same context, threads and greedy sampling on both sides:
(a) ``llama_cpp.Llama`` in this process, ``create_completion(stream=True)``;
(b) ``localrun serve`` (a server process, the model in its worker) through the official
``openai`` client, streamed. Each run uses a fresh prompt (no prefix reuse); TTFT is the
client-side time to the first non-empty text; decode tok/s = (tokens − 1) / (last − first).
p50 over ``--runs`` runs after one warm-up. Targets: decode ratio ≥ 0.95.

With ``--concurrency``, it also measures aggregate decode throughput at those levels
against ``python -m llama_cpp.server`` (needs its extra deps: sse-starlette,
starlette-context; skipped with a note when they are missing). One server at a time.
"""

from __future__ import annotations

import argparse
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

from benchmarks.common import free_port, gemma_path, start_llama_cpp_python_server, stop, wait_ready  # noqa: E402

PROMPT = "Run {i}. Write a long, detailed story about a lighthouse keeper who finds a strange machine on the beach."
N_CTX = 2048


def summarize(samples: list[tuple[float, float, int]]) -> tuple[float, float]:
    """(p50 TTFT seconds, p50 decode tok/s) from (ttft, decode_s, tokens) samples."""
    ttft = statistics.median(s[0] for s in samples)
    rate = statistics.median((s[2] - 1) / s[1] for s in samples if s[1] > 0 and s[2] > 1)
    return ttft, rate


def load_in_process(model: Path, threads: int):
    from llama_cpp import Llama

    return Llama(str(model), n_ctx=N_CTX, n_threads=threads, n_threads_batch=threads, n_gpu_layers=0, verbose=False)


def in_process_run(llm, i: str, max_tokens: int) -> tuple[float, float, int]:
    """One streamed completion; every streamed part is one token (some carry no text yet)."""
    start = time.perf_counter()
    first = last = None
    n = 0
    for part in llm.create_completion(PROMPT.format(i=i), max_tokens=max_tokens, temperature=0.0, stream=True):
        now = time.perf_counter()
        n += 1
        if first is None and part["choices"][0]["text"]:
            first = now
        last = now
    return first - start, last - first, n


def start_localrun(model: Path, home: Path, threads: int) -> tuple[subprocess.Popen, str]:
    env = dict(
        os.environ,
        LOCALRUN_HOME=str(home),
        LOCALRUN_RUNTIME__THREADS=str(threads),
        LOCALRUN_RUNTIME__CONTEXT_LENGTH=str(N_CTX),
        PYTHONPATH=str(ROOT),
    )
    env.pop("LOCALRUN_RUNTIME__FORCE", None)
    subprocess.run(
        [sys.executable, "-m", "localrun", "import", str(model), "--name", "gemma"],
        env=env,
        check=True,
        capture_output=True,
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localrun", "serve", "--no-default-model", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{url}/health")
    return proc, url


def one_stream(client, i: str, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT, first-to-last seconds, completion tokens: the usage chunk's, else one per text chunk)."""
    start = time.perf_counter()
    first = last = None
    tokens = chunks = 0
    stream = client.completions.create(
        model="gemma",
        prompt=PROMPT.format(i=i),
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for part in stream:
        if part.choices and part.choices[0].text:
            last = time.perf_counter()
            first = first or last
            chunks += 1
        if part.usage:
            tokens = part.usage.completion_tokens
    return first - start, last - first, tokens or chunks


def bench_concurrency(url: str, level: int, max_tokens: int, tag: str) -> tuple[float, float]:
    """(aggregate decode tok/s, p50 TTFT) with ``level`` streams started together."""
    import openai

    results: list[tuple[float, float, int]] = []
    with openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600) as client:
        threads = [
            threading.Thread(target=lambda k=k: results.append(one_stream(client, f"{tag}-c{level}-{k}", max_tokens)))
            for k in range(level)
        ]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    return sum(r[2] for r in results) / wall, statistics.median(r[0] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--concurrency", default="", help="comma-separated levels, e.g. 1,2,4,8 (compares with llama_cpp.server)"
    )
    ap.add_argument("--concurrency-tokens", type=int, default=64, help="max_tokens per stream in the concurrency runs")
    args = ap.parse_args()
    import openai

    model = gemma_path()
    print(
        f"model {model.name}, n_ctx {N_CTX}, {args.threads} threads, greedy, max_tokens {args.max_tokens}, p50 of "
        f"{args.runs} runs"
    )
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    llm = load_in_process(model, args.threads)
    with tempfile.TemporaryDirectory() as home:
        proc, url = start_localrun(model, Path(home), args.threads)
        try:
            with openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=300) as client:
                in_process_run(llm, "warm", args.max_tokens)
                one_stream(client, "warm", args.max_tokens)
                a, b = [], []
                for i in range(args.runs):  # alternate, so a busy moment hits both sides alike
                    a.append(in_process_run(llm, f"a{i}", args.max_tokens))
                    b.append(one_stream(client, f"b{i}", args.max_tokens))
            del llm
            ttft_a, rate_a = summarize(a)
            ttft_b, rate_b = summarize(b)
            print(f"(a) llama-cpp-python in-process  : TTFT {ttft_a * 1000:7.1f} ms   decode {rate_a:6.1f} tok/s")
            print(f"(b) localrun serve, openai client: TTFT {ttft_b * 1000:7.1f} ms   decode {rate_b:6.1f} tok/s")
            print(
                f"ratios (b)/(a): decode {rate_b / rate_a:.3f}   TTFT {ttft_b / ttft_a:.2f}x "
                f"({(ttft_b - ttft_a) * 1000:+.1f} ms)",
                flush=True,
            )
            if levels:
                concurrency_table(url, model, levels, args)
        finally:
            stop(proc)


def concurrency_table(url: str, model: Path, levels: list[int], args) -> None:
    """Aggregate throughput per level, alternating localrun and llama_cpp.server level by level."""
    import openai

    other = start_llama_cpp_python_server(model, args.threads, N_CTX)
    rows = []
    try:
        if other:
            with openai.OpenAI(base_url=f"{other[1]}/v1", api_key="bench", max_retries=0, timeout=300) as client:
                one_stream(client, "warm", 8)
        for n in levels:
            ours = bench_concurrency(url, n, args.concurrency_tokens, "lr")
            theirs = bench_concurrency(other[1], n, args.concurrency_tokens, "lc") if other else None
            rows.append((n, ours, theirs))
            print(
                f"  {n} streams: localrun {ours[0]:.1f} tok/s"
                + (f", llama_cpp.server {theirs[0]:.1f} tok/s" if theirs else ""),
                flush=True,
            )
    finally:
        if other:
            stop(other[0])
    print("concurrency  localrun agg tok/s (p50 TTFT)   llama_cpp.server agg tok/s (p50 TTFT)   ratio")
    for n, (agg, ttft), theirs in rows:
        line = f"{n:>11}  {agg:10.1f} ({ttft * 1000:7.0f} ms)"
        if theirs:
            line += f"          {theirs[0]:10.1f} ({theirs[1] * 1000:7.0f} ms)          {agg / theirs[0]:5.2f}"
        print(line)


if __name__ == "__main__":
    main()
