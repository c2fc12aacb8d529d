"""Generation speed in a worker that also serves embeddings, before and after its first
embedding request (runtimes/llamacpp/calls.py says why it can change).

One run, Gemma 3 270M, 2 threads, greedy, single stream. Each contender is a fresh process
(as a model runs in its own worker): it decodes ``--max-tokens`` tokens ``--rounds`` times,
answers one embedding request from another thread that then stays alive (as the server's
pooled request threads do),
then decodes as many times again. Contenders:

* ``scheduler`` — localrun as built: the embedding's ``llama_decode`` runs on the
  scheduler thread, between two steps;
* ``request-thread`` — the embedding evaluated on the asking thread, as localrun did
  before (the embedder's ``call`` removed), for the comparison.

Prints tok/s before and after and the ratio after ÷ before, median of the rounds; the
processes alternate so the machine's drift falls on both alike.

    .venv/bin/python benchmarks/bench_embed_beside.py [--max-tokens 128] [--rounds 5] [--processes 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_speculative import localrun_one  # noqa: E402
from benchmarks.common import gemma_path  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
PASSAGE = (
    "The lighthouse stood on a rock a mile from the shore. Its keeper lit the lamp at dusk, wound the clockwork "
    "that turned the lens, and wrote the ships he saw in a book. "
) * 4


def _rate(session, max_tokens: int) -> float:
    return localrun_one(session, PROMPT, max_tokens)["rate"]  # timed as bench_speculative times it


def contender(where: str, model: str, threads: int, max_tokens: int, rounds: int) -> dict:
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime
    from localrun.types import Format, ModelRecord, Plan

    plan = Plan(
        runtime="llama.cpp",
        n_ctx=1024,
        n_threads=threads,
        n_batch=512,
        options={"speculative": "off", "embedding": True, "prefix_cache": False},
    )
    session = LlamaCppRuntime().load(ModelRecord(name="gemma", format=Format.GGUF, path=model), plan)
    try:
        if where == "request-thread":
            session._features._call = None  # the embedder then evaluates on the asking thread
        _rate(session, 8)  # warm
        before = [_rate(session, max_tokens) for _ in range(rounds)]
        # The asking thread lives on, as a server's pooled request threads do (an OpenMP team
        # belongs to a live thread: one that has ended takes its team with it).
        asked, done = threading.Event(), threading.Event()

        def request_thread():
            session.embed([PASSAGE])
            asked.set()
            done.wait()

        asker = threading.Thread(target=request_thread, name="request", daemon=True)
        asker.start()
        asked.wait()
        after = [_rate(session, max_tokens) for _ in range(rounds)]
        done.set()
        asker.join()
    finally:
        session.close()
    return {"before": statistics.median(before), "after": statistics.median(after)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="decodes before and after, per process (median kept)")
    ap.add_argument("--processes", type=int, default=3, help="fresh processes per contender, alternating")
    args = ap.parse_args()
    model = str(gemma_path())
    print(
        f"load before: {os.getloadavg()[0]:.2f} (1-min), {os.cpu_count()} CPUs; Gemma 3 270M, {args.threads} threads, "
        f"{args.max_tokens} tokens greedy"
    )
    results: dict[str, list[dict]] = {"scheduler": [], "request-thread": []}
    spawn = multiprocessing.get_context("spawn")
    for i in range(args.processes):
        for where in results if i % 2 == 0 else reversed(list(results)):
            with spawn.Pool(1) as pool:
                got = pool.apply(contender, (where, model, args.threads, args.max_tokens, args.rounds))
            results[where].append(got)
            print(
                f"  process {i + 1} {where:>15}: {got['before']:6.1f} → {got['after']:6.1f} tok/s "
                f"({got['after'] / got['before']:.2f})",
                flush=True,
            )
    print(f"\n{'embeddings run on':>18} | before tok/s | after tok/s | after ÷ before")
    for where, runs in results.items():
        b = statistics.median(r["before"] for r in runs)
        a = statistics.median(r["after"] for r in runs)
        ratio = statistics.median(r["after"] / r["before"] for r in runs)
        print(f"{where:>18} | {b:12.1f} | {a:11.1f} | {ratio:.2f}")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
