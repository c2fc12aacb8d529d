"""Speculative decoding on short chat answers, at 1 and 2 threads: where ``auto`` must not
cost anything (the case the issue-13 benchmark does not cover; open, see the note).

    python benchmarks/bench_speculative_chat.py [--threads 1,2] [--processes 3] [--max-tokens 48]
    LLAMA_SERVER_BIN=.../llama-server   (the anchor, plain and with --spec-type ngram-simple; skipped when unset)

Gemma 3 270M (a base model: localrun renders its chat as the plain transcript
``User: …\\nAssistant:``), eight prompts "Write one sentence about the X (#N).", greedy, up to
``--max-tokens`` tokens, the transcript's stops. A base model answering them first echoes the
prompt for a few tokens, then goes another way: a copy that looks promising and does not
last, and on one thread a verification pass costs more (a 4-row pass ~3 one-row steps,
against ~2.2 on two), so the run-length estimate's promise is only just worth a pass.

Each localrun contender (``off``, ``auto``) is a fresh process per round, as a model runs
in its own worker, alternating with the other; llama-server is one process per setting, up
for the whole run, streamed and timed the same way (its ``timings`` give the token and
draft counts). Printed per thread count: the median over rounds of each contender's median
decode tok/s over the eight answers, drafts kept, and ``auto ÷ off``. Measured (2026-12-01,
load ~1.5): auto ÷ off 0.95 on 1 thread (rounds 0.94, 1.00, 1.03), 0.99 on 2 (0.99, 0.91,
1.18); llama-server's ngram-simple ÷ its plain 0.93 and 0.97. Without the "(#N)" tags the
same answers gain (1.07 and 1.15).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port, gemma_path, stop, wait_ready  # noqa: E402

WORDS = "river stone lamp orchard violin harbor meadow lantern".split()
STOPS = ["User:", "Assistant:"]


def prompts() -> list[str]:
    # Tagged as bench_upstream.py tags its prompts: the model echoes "Write one sentence about
    # the river (#" and then writes another number, a copy that breaks a token after it paid.
    return [f"Write one sentence about the {w} (#{i + 1})." for i, w in enumerate(WORDS)]


def localrun_round(mode: str, model: str, threads: int, max_tokens: int) -> dict:
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime
    from localrun.types import Cancel, ChatRequest, Format, Message, ModelRecord, Plan, Sampling

    plan = Plan(runtime="llama.cpp", n_ctx=2048, n_threads=threads, n_batch=512, options={"speculative": mode})
    session = LlamaCppRuntime().load(ModelRecord(name="gemma", format=Format.GGUF, path=model), plan)
    rates, drafted, accepted = [], 0, 0
    try:
        for text in ["Say hello.", *prompts()]:  # the first warms the context up and is not counted
            req = ChatRequest(
                messages=(Message("user", text),), sampling=Sampling(temperature=0.0, max_tokens=max_tokens)
            )
            first = last = usage = None
            for chunk in session.chat(req, Cancel()):
                if chunk.text:
                    last = time.perf_counter()
                    first = first or last
                usage = chunk.usage or usage
            if text == "Say hello.":
                continue
            if usage.completion_tokens > 1 and last > first:
                rates.append((usage.completion_tokens - 1) / (last - first))
            drafted, accepted = drafted + usage.drafted_tokens, accepted + usage.accepted_tokens
    finally:
        session.close()
    return {"rate": statistics.median(rates), "drafted": drafted, "accepted": accepted}


class LlamaServer:
    def __init__(self, binary: str, model: Path, threads: int, spec: str | None) -> None:
        self.spec, port = spec, free_port()
        args = [
            binary,
            "-m",
            str(model),
            "--port",
            str(port),
            "-c",
            "2048",
            "-np",
            "1",
            "-t",
            str(threads),
            "-tb",
            str(threads),
        ] + (["--spec-type", spec] if spec else [])
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        wait_ready(self.proc, f"{self.url}/health")

    def round(self, max_tokens: int) -> dict:
        import httpx

        rates, drafted, accepted = [], 0, 0
        for text in prompts():
            body = {
                "prompt": f"User: {text}\nAssistant:",
                "n_predict": max_tokens,
                "temperature": 0,
                "stop": STOPS,
                "cache_prompt": False,
                "stream": True,
            }
            first = last = None
            t: dict = {}
            # Timed as localrun's are: tokens after the first ÷ time from the first to the last
            # (its own predicted_per_second also counts the first token's time).
            with httpx.stream("POST", f"{self.url}/completion", json=body, timeout=600) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    if event.get("content"):
                        last = time.perf_counter()
                        first = first or last
                    t = event.get("timings") or t
            n = int(t.get("predicted_n", 0))
            if n > 1 and first and last > first:
                rates.append((n - 1) / (last - first))
            drafted += t.get("draft_n", 0)
            accepted += t.get("draft_n_accepted", 0)
        return {"rate": statistics.median(rates), "drafted": drafted, "accepted": accepted}

    def close(self) -> None:
        stop(self.proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--processes", type=int, default=3, help="rounds: fresh localrun processes per contender")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    model = gemma_path()
    binary = os.environ.get("LLAMA_SERVER_BIN")
    skipped = "" if binary else "; llama-server skipped (LLAMA_SERVER_BIN unset)"
    print(
        f"load before: {os.getloadavg()[0]:.2f} (1-min), {os.cpu_count()} CPUs; Gemma 3 270M, {len(WORDS)} chat "
        f"answers of up to {args.max_tokens} tokens, greedy{skipped}"
    )
    spawn = multiprocessing.get_context("spawn")
    for threads in (int(t) for t in args.threads.split(",")):
        servers = [LlamaServer(binary, model, threads, spec) for spec in (None, "ngram-simple")] if binary else []
        runs: dict[str, list[dict]] = {"off": [], "auto": [], **{f"ls:{s.spec or 'none'}": [] for s in servers}}
        try:
            for i in range(args.processes):
                for mode in ("off", "auto") if i % 2 == 0 else ("auto", "off"):
                    with spawn.Pool(1) as pool:
                        runs[mode].append(pool.apply(localrun_round, (mode, str(model), threads, args.max_tokens)))
                for srv in servers:
                    runs[f"ls:{srv.spec or 'none'}"].append(srv.round(args.max_tokens))
                print(
                    f"  {threads} thread(s), round {i + 1}: "
                    + ", ".join(f"{k} {v[-1]['rate']:.1f}" for k, v in runs.items()),
                    flush=True,
                )
        finally:
            for srv in servers:
                srv.close()
        print(f"\n{threads} thread(s)  {'contender':<16} {'tok/s':>7}  kept/drafted")
        med = {}
        for who, rs in runs.items():
            med[who] = statistics.median(r["rate"] for r in rs)
            d, a = sum(r["drafted"] for r in rs), sum(r["accepted"] for r in rs)
            print(f"{'':13}{who:<16} {med[who]:>7.1f}  {a}/{d}" + (f" ({a / d:.0%})" if d else ""))
        pairs = [a["rate"] / o["rate"] for a, o in zip(runs["auto"], runs["off"])]
        print(
            f"{'':13}auto ÷ off {med['auto'] / med['off']:.2f} (per round {', '.join(f'{r:.2f}' for r in pairs)}; "
            f"target ≥ 0.97)\n"
        )
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
