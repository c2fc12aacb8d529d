"""Continuous batching: localrun's llama.cpp scheduler against the engine and other servers.

    python benchmarks/bench_batching.py [--levels 1,2,4,8] [--max-tokens 64] [--rounds 3] [--threads 2]

One run, Gemma 3 270M Q4_K_M, greedy, the same thread count everywhere (n_threads and
n_threads_batch), 4,096 tokens of context per stream, a fresh prompt per request:

(a) localrun: the model in a worker process (``WorkerHandle``), 8 slots, through the pipe
    (8 slots: past the batch-invariant default, so 8 streams decode in one 8-row call);
(b) ``python -m llama_cpp.server`` (one request at a time), through the openai client;
(c) the engine's batched ceiling: the same work (N prompts prefilled, then N sequences
    decoded together, one ``llama_decode`` per step) on the low-level API in this process,
    no server, no scheduler, no pipe;
(d) ``llama-server -np N`` when ``LLAMA_SERVER_BIN`` names the binary (skipped otherwise).

Per concurrency level: aggregate tok/s (completion tokens of all streams ÷ wall time) and
p50/p99 TTFT (request sent → first non-empty text). Then a multi-turn check: a 2,000-token
system prompt, turn-2 TTFT ÷ cold TTFT, measured while three other streams run.
Targets: (a) ≥ 0.9 × (c) aggregate; (a) single stream ≥ 0.95 × (c) at N=1 (native decode);
(a) p95 TTFT at 4 ≤ single-stream TTFT + one prefill chunk; multi-turn ratio ≤ 0.05.
Run it when ``uptime`` is lowest; compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SLOT_CTX = 4096
N_SLOTS = 8
STEP_TOKENS = 256
from benchmarks.common import free_port, gemma_path, start_llama_cpp_python_server, stop, wait_ready  # noqa: E402

PROMPT = "Request {i}. Write a long, detailed story about a lighthouse keeper who finds a strange machine on the beach."


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


class Level:
    """Samples of one concurrency level: (TTFT s, completion tokens) per stream, wall time per round."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.tokens = 0
        self.wall = 0.0

    @property
    def rate(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0

    def row(self) -> str:
        return (
            f"{self.rate:7.1f} tok/s  TTFT p50 {pct(self.ttft, 50) * 1000:6.0f} ms  p99 "
            f"{pct(self.ttft, 99) * 1000:6.0f} ms"
        )


def run_level(one, n: int, rounds: int, tag: str) -> Level:
    """``rounds`` times: ``n`` streams started together; ``one(prompt) -> (ttft, tokens)``."""
    level = Level()
    for r in range(rounds):
        out: list = [None] * n
        barrier = threading.Barrier(n)

        def go(k: int, barrier=barrier, out=out, r=r) -> None:  # this round's, bound now
            barrier.wait()
            out[k] = one(PROMPT.format(i=f"{tag}-{n}-{r}-{k}"))

        threads = [threading.Thread(target=go, args=(k,)) for k in range(n)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        level.wall += time.perf_counter() - start
        for ttft, tokens in out:
            level.ttft.append(ttft)
            level.tokens += tokens
    return level


# --- (a) localrun through a worker ------------------------------------------------------------


def start_localrun(model: Path, threads: int, log_dir: Path):
    from localrun.types import Format, ModelRecord, Plan
    from localrun.worker.host import WorkerHandle

    plan = Plan(
        runtime="llama.cpp",
        n_ctx=N_SLOTS * SLOT_CTX,
        n_threads=threads,
        options={"n_slots": N_SLOTS, "slot_ctx": SLOT_CTX, "step_tokens": STEP_TOKENS},
    )
    return WorkerHandle(
        ModelRecord(name="gemma", format=Format.GGUF, path=str(model)),
        plan,
        log_path=log_dir / "worker.log",
        load_timeout_s=300,
    )


def localrun_stream(handle, req, usage: list | None = None) -> tuple[float, int]:
    from localrun.worker.host import iter_chunks

    start = time.perf_counter()
    first, tokens = None, 0
    for chunk in iter_chunks(handle, req):
        if first is None and chunk.text:
            first = time.perf_counter() - start
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
            if usage is not None:
                usage.append(chunk.usage)
    return (first if first is not None else time.perf_counter() - start), tokens


def localrun_decode_rate(handle, max_tokens: int, rounds: int) -> float:
    """Median single-stream decode tok/s, first to last token (TTFT left out), through the pipe."""
    from localrun.types import CompletionRequest, Sampling
    from localrun.worker.host import iter_chunks

    rates = []
    for r in range(rounds):
        req = CompletionRequest(PROMPT.format(i=f"decode-{r}"), Sampling(temperature=0.0, max_tokens=max_tokens))
        first = last = None
        tokens = 0
        for chunk in iter_chunks(handle, req):
            if chunk.text:
                last = time.perf_counter()
                first = first or last
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        rates.append((tokens - 1) / (last - first))
    return statistics.median(rates)


def localrun_one(handle, max_tokens: int):
    from localrun.types import CompletionRequest, Sampling

    return lambda prompt: localrun_stream(
        handle, CompletionRequest(prompt, Sampling(temperature=0.0, max_tokens=max_tokens))
    )


# --- (b) and (d): servers behind the openai client ---------------------------------------------


def start_llama_server(binary: str, model: Path, threads: int, n_parallel: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "-m",
            str(model),
            "--port",
            str(port),
            "-c",
            str(SLOT_CTX * n_parallel),
            "-np",
            str(n_parallel),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "--alias",
            "gemma",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{url}/health")
    return proc, url


def openai_one(url: str, max_tokens: int):
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)

    def one(prompt: str) -> tuple[float, int]:
        start = time.perf_counter()
        first, tokens, parts = None, 0, 0
        stream = client.completions.create(
            model="gemma",
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for part in stream:
            if part.choices and part.choices[0].text:
                parts += 1
                if first is None:
                    first = time.perf_counter() - start
            if part.usage:
                tokens = part.usage.completion_tokens
        return (first if first is not None else time.perf_counter() - start), tokens or parts

    return one


# --- (c) the engine's batched ceiling --------------------------------------------------------


class Engine:
    """N sequences in one context, one ``llama_decode`` per step, C greedy samplers: what the
    engine does with no scheduler around it. Same settings as (a): one KV stream per
    sequence, llama.cpp's defaults otherwise (flash attention auto, weight repacking)."""

    def __init__(self, model: Path, threads: int) -> None:
        from localrun.runtimes.llamacpp.context import llama_lib

        self.llama = L = llama_lib()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(model).encode(), mp)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.threads = threads

    def tokenize(self, text: str) -> list[int]:
        L, data = self.llama, text.encode()
        buf = (L.llama_token * (len(data) + 8))()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, len(data) + 8, True, True)
        return list(buf[:n])

    def _context(self, n_seq: int):
        L = self.llama
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_seq_max = SLOT_CTX * n_seq, n_seq
        cp.n_batch = cp.n_ubatch = max(STEP_TOKENS, n_seq)
        cp.n_threads = cp.n_threads_batch = self.threads
        return L.llama_init_from_model(self.model, cp)

    def ceiling(self, n_seq: int, max_tokens: int) -> float:
        """Aggregate tok/s for the same work as one round of (a): prefill N fresh prompts
        (one call), then decode until each has ``max_tokens`` tokens, one call per step."""
        L = self.llama
        ctx = self._context(n_seq)
        batch = L.llama_batch_init(max(STEP_TOKENS, 64 * n_seq), 0, 1)
        samplers = []
        try:
            prompts = [self.tokenize(PROMPT.format(i=f"engine-{n_seq}-{s}")) for s in range(n_seq)]
            for _ in range(n_seq):
                chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
                samplers.append(chain)
            start = time.perf_counter()
            i, last = 0, []
            for s, toks in enumerate(prompts):
                for p, tok in enumerate(toks):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = (
                        tok,
                        p,
                        1,
                        s,
                        p == len(toks) - 1,
                    )
                    i += 1
                last.append(i - 1)
            batch.n_tokens = i
            assert L.llama_decode(ctx, batch) == 0
            pending = [L.llama_sampler_sample(samplers[s], ctx, last[s]) for s in range(n_seq)]
            pos = [len(toks) for toks in prompts]
            for _ in range(max_tokens - 1):
                for s in range(n_seq):
                    batch.token[s], batch.pos[s], batch.n_seq_id[s], batch.seq_id[s][0], batch.logits[s] = (
                        pending[s],
                        pos[s],
                        1,
                        s,
                        1,
                    )
                batch.n_tokens = n_seq
                assert L.llama_decode(ctx, batch) == 0
                for s in range(n_seq):
                    pending[s] = L.llama_sampler_sample(samplers[s], ctx, s)
                    pos[s] += 1
            return n_seq * max_tokens / (time.perf_counter() - start)
        finally:
            for chain in samplers:
                L.llama_sampler_free(chain)
            L.llama_batch_free(batch)
            L.llama_free(ctx)

    def decode_only(self, steps: int) -> float:
        """Single-sequence decode tok/s of the minimal loop, prompt left out: native decode."""
        L = self.llama
        ctx = self._context(1)
        batch = L.llama_batch_init(STEP_TOKENS, 0, 1)
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        try:
            toks = self.tokenize(PROMPT.format(i="decode-only"))
            self._fill(batch, toks, 0, 0)
            assert L.llama_decode(ctx, batch) == 0
            token, pos = L.llama_sampler_sample(chain, ctx, len(toks) - 1), len(toks)
            start = time.perf_counter()
            for _ in range(steps):
                batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = (
                    token,
                    pos,
                    1,
                    0,
                    1,
                )
                batch.n_tokens = 1
                assert L.llama_decode(ctx, batch) == 0
                token, pos = L.llama_sampler_sample(chain, ctx, 0), pos + 1
            return steps / (time.perf_counter() - start)
        finally:
            L.llama_sampler_free(chain)
            L.llama_batch_free(batch)
            L.llama_free(ctx)

    def chunk_seconds(self) -> float:
        """One prefill chunk of STEP_TOKENS tokens: what a newcomer may wait behind."""
        L = self.llama
        ctx = self._context(1)
        batch = L.llama_batch_init(STEP_TOKENS, 0, 1)
        try:
            toks = (self.tokenize(PROMPT.format(i="chunk")) * 20)[:STEP_TOKENS]
            best = float("inf")
            for _ in range(3):
                L.llama_memory_clear(L.llama_get_memory(ctx), True)
                self._fill(batch, toks, 0, 0)
                t = time.perf_counter()
                assert L.llama_decode(ctx, batch) == 0
                best = min(best, time.perf_counter() - t)
            return best
        finally:
            L.llama_batch_free(batch)
            L.llama_free(ctx)

    @staticmethod
    def _fill(batch, toks: list[int], start: int, seq: int) -> None:
        for i, tok in enumerate(toks):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = (
                tok,
                start + i,
                1,
                seq,
                0,
            )
        batch.logits[len(toks) - 1] = 1
        batch.n_tokens = len(toks)


# --- multi-turn -----------------------------------------------------------------------------


def system_prompt(engine: Engine, tokens: int = 2000) -> str:
    sentence = (
        "You are the assistant of a harbour office. Ships arrive at dawn and leave at dusk; every cargo is "
        "logged with its weight, its owner and the berth it used. "
    )
    text = ""
    while len(engine.tokenize(text)) < tokens:
        text += sentence
    return text


def multi_turn(handle, system: str, rounds: int = 2) -> tuple[float, float]:
    """(median cold TTFT, median turn-2 TTFT) of a chat with ``system``, three other streams running."""
    from localrun.types import ChatRequest, CompletionRequest, Message, Sampling

    stop_bg = threading.Event()

    def background(k: int) -> None:
        i = 0
        while not stop_bg.is_set():
            localrun_stream(
                handle, CompletionRequest(PROMPT.format(i=f"bg-{k}-{i}"), Sampling(temperature=0.0, max_tokens=48))
            )
            i += 1

    bg = [threading.Thread(target=background, args=(k,), daemon=True) for k in range(3)]
    for t in bg:
        t.start()
    time.sleep(1.0)
    cold, warm = [], []
    try:
        for r in range(rounds):
            sys_msg = Message("system", f"Office {r}. " + system)  # a new system prompt: nothing cached
            q1 = Message("user", "Which berth did the ship Aurora use?")
            sampling = Sampling(temperature=0.0, max_tokens=24)
            usage: list = []
            ttft, _ = localrun_stream(handle, ChatRequest((sys_msg, q1), sampling), usage)
            cold.append(ttft)
            answer = Message("assistant", "The Aurora used berth four.")
            q2 = Message("user", "And who owned its cargo?")
            ttft2, _ = localrun_stream(handle, ChatRequest((sys_msg, q1, answer, q2), sampling), usage)
            warm.append(ttft2)
            print(
                f"    multi-turn round {r}: cold {ttft * 1000:.0f} ms ({usage[0].prompt_tokens} prompt tokens), "
                f"turn 2 {ttft2 * 1000:.0f} ms ({usage[1].cached_tokens} of {usage[1].prompt_tokens} cached)",
                flush=True,
            )
    finally:
        stop_bg.set()
        for t in bg:
            t.join(60)
    return statistics.median(cold), statistics.median(warm)


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    model = gemma_path()
    print(
        f"{model.name}, {args.threads} threads, {SLOT_CTX} tokens per stream, greedy, max_tokens {args.max_tokens}, "
        f"{args.rounds} rounds per level; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    results: dict[str, dict[int, Level]] = {"a": {}, "b": {}, "d": {}}
    ceiling: dict[int, float] = {}

    engine = Engine(model, args.threads)
    for n in levels:
        ceiling[n] = max(engine.ceiling(n, args.max_tokens) for _ in range(2))
        print(f"(c) engine ceiling, {n} sequences: {ceiling[n]:.1f} tok/s", flush=True)
    chunk_s = engine.chunk_seconds()
    native = statistics.median(engine.decode_only(args.max_tokens - 1) for _ in range(3))
    print(f"(c) native single-sequence decode (prompt left out): {native:.1f} tok/s", flush=True)
    system = system_prompt(engine)

    with tempfile.TemporaryDirectory() as tmp:
        handle = start_localrun(model, args.threads, Path(tmp))
        try:
            localrun_one(handle, 8)("warm-up")
            decode_a = localrun_decode_rate(handle, args.max_tokens, 3)
            print(f"(a) single-stream decode (TTFT left out): {decode_a:.1f} tok/s", flush=True)
            for n in levels:
                results["a"][n] = run_level(localrun_one(handle, args.max_tokens), n, args.rounds, "lr")
                print(f"(a) localrun, {n} streams: {results['a'][n].row()}", flush=True)
            cold, warm = multi_turn(handle, system)
            print(
                f"(a) multi-turn, 3 other streams running: cold TTFT {cold * 1000:.0f} ms, turn 2 {warm * 1000:.0f} ms",
                flush=True,
            )
        finally:
            handle.close()

    server = start_llama_cpp_python_server(model, args.threads, SLOT_CTX)
    if server:
        try:
            openai_one(server[1], 8)("warm-up")
            for n in levels:
                results["b"][n] = run_level(openai_one(server[1], args.max_tokens), n, args.rounds, "lc")
                print(f"(b) llama_cpp.server, {n} streams: {results['b'][n].row()}", flush=True)
        finally:
            stop(server[0])

    binary = os.environ.get("LLAMA_SERVER_BIN")
    if binary and shutil.which(binary):
        for n in levels:
            proc, url = start_llama_server(binary, model, args.threads, n)
            try:
                openai_one(url, 8)("warm-up")
                results["d"][n] = run_level(openai_one(url, args.max_tokens), n, args.rounds, "ls")
                print(f"(d) llama-server -np {n}: {results['d'][n].row()}", flush=True)
            finally:
                stop(proc)
    else:
        print("(d) llama-server skipped: set LLAMA_SERVER_BIN to its binary")

    print(
        "\nstreams   (a) localrun              (b) llama_cpp.server      (c) engine   (d) llama-server   (a)/(c)  "
        "(a)/(b)"
    )
    for n in levels:
        a, b, d = results["a"][n], results["b"].get(n), results["d"].get(n)
        print(
            f"{n:>7}   {a.rate:6.1f} tok/s {pct(a.ttft, 50) * 1000:6.0f} ms   "
            + (f"{b.rate:6.1f} tok/s {pct(b.ttft, 50) * 1000:7.0f} ms   " if b else f"{'-':>24}   ")
            + f"{ceiling[n]:6.1f} tok/s   "
            + (f"{d.rate:6.1f} tok/s     " if d else f"{'-':>14}     ")
            + f"{a.rate / ceiling[n]:6.2f}   "
            + (f"{a.rate / b.rate:6.2f}" if b else "     -")
        )
    single = results["a"].get(1)
    four = results["a"].get(4)
    print("\ntargets")
    print(f"  single-stream decode (a) ÷ native (c), TTFT left out: {decode_a / native:.3f}   (≥ 0.95)")
    if single:
        print(f"  single-stream request (a) ÷ (c) at 1, TTFT included: {single.rate / ceiling[1]:.3f}")
    for n in levels:
        print(f"  aggregate (a) ÷ (c) at {n}: {results['a'][n].rate / ceiling[n]:.3f}   (≥ 0.9)")
    if single and four:
        bound = pct(single.ttft, 50) + chunk_s
        print(
            f"  p95 TTFT at 4: {pct(four.ttft, 95) * 1000:.0f} ms; single-stream TTFT + one {STEP_TOKENS}-token chunk: "
            f"{bound * 1000:.0f} ms   ({'met' if pct(four.ttft, 95) <= bound else 'missed'})"
        )
    print(f"  multi-turn turn-2 ÷ cold TTFT: {warm / cold:.3f}   (≤ 0.05)")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
