"""Speculative decoding: localrun with and without drafts, native llama.cpp, and
llama-server's own n-gram speculation, on the same prompts in one run.

    python benchmarks/bench_speculative.py [--max-tokens 256] [--threads 2] [--spec-types "ngram-mod;ngram-simple"]
    LLAMA_SERVER_BIN=.../llama-server LLAMA_BENCH_BIN=.../llama-bench   (the anchors; skipped when unset)

``scripts/build-llama-server --native`` builds both from the llama.cpp that the installed
llama-cpp-python vendors, for this CPU (as pip builds the wheel), and prints their folder.

Gemma 3 270M Q4_K_M, 2 threads, single stream, greedy. Workloads:
(a) agent edit: a ~200-line source file to rewrite with one small change;
(b) RAG: answer by quoting a given passage;
(c) free generation from a short prompt.

Per workload: decode tok/s (tokens after the first ÷ time from the first to the last) of
localrun off (``speculative=off``), localrun auto, the engine's plain greedy loop on the
low-level API in this process (native llama.cpp decode on the same prompt), and
llama-server with no speculation and with each ``--spec-type`` given (its ``timings``; all
the servers are up for the whole run); the median of ``--rounds`` rounds in which every
contender runs once per workload in a rotating order (this machine's speed drifts by
~15 % from minute to minute); plus ``llama-bench`` tg128 for reference. Then 4 concurrent
streams (a, b, c, a): aggregate tok/s with and without speculation (median of 2).
Acceptance rates per workload.

Targets (issue 13): (a) auto >= 2.0x off and >= 1.5x llama-server's best; (b) >= 1.5x off;
(c) >= 0.97x off; 4 streams: auto >= off. Say ``uptime`` with the numbers: this machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port, gemma_path, stop, wait_ready  # noqa: E402

SLOT_CTX = 4096
#: llama-server's n-gram speculation (its --spec-type values in this llama.cpp), with their
#: defaults and one ngram-mod tuned for short drafts (its defaults draft 48-64 tokens).
SERVER_SPECS = (
    "ngram-simple",
    "ngram-map-k",
    "ngram-mod",
    "ngram-cache",
    "ngram-mod --spec-ngram-mod-n-min 4 --spec-ngram-mod-n-max 16 --spec-ngram-mod-n-match 8",
)


def source_file(lines: int = 200) -> str:
    """A deterministic ~200-line Python module (an inventory model), the file to edit."""
    out = ['"""Inventory bookkeeping for a small shop."""', "", "from dataclasses import dataclass", "", ""]
    items = [
        "apple",
        "bread",
        "candle",
        "drill",
        "envelope",
        "fabric",
        "glue",
        "hammer",
        "ink",
        "jar",
        "kettle",
        "lamp",
        "marker",
        "nail",
        "oil",
        "paper",
        "quilt",
        "rope",
        "soap",
        "tape",
    ]
    out += ["RESTOCK_THRESHOLD = 5", "", ""]
    for i, name in enumerate(items):
        out += [
            "@dataclass",
            f"class {name.capitalize()}Stock:",
            f'    """Stock of {name}s on shelf {i + 1}."""',
            f"    count: int = {10 + i}",
            f"    price_cents: int = {100 + 25 * i}",
            "",
            "    def needs_restock(self) -> bool:",
            "        return self.count < RESTOCK_THRESHOLD",
            "",
        ]
        if len(out) >= lines:
            break
    return "\n".join(out[:lines]) + "\n"


PASSAGE = (
    "The lighthouse on Gull Point was built in 1871 from granite quarried on the island itself. Its first keeper, "
    "Margaret Hale, kept the lamp burning for thirty-two years and recorded every passing ship in a leather log "
    "that is now held by the county museum. In 1924 the original oil lamp was replaced by an electric lamp "
    "installed by the engineer Tomas Reyes, who also added a fog signal that could be heard eleven miles away. "
    "The station was automated in 1968, and the keeper's cottage became a school for marine biology in 1979. "
    "Visitors may climb the one hundred and twelve steps to the gallery on weekends between May and September."
)
#: Prompts a base model continues the way the workload asks (Gemma 3 270M is a base model:
#: an instruction to "rewrite the file" makes it ramble, a document that shows the file and
#: then begins its new version makes it copy, as an agent's edit does).
WORKLOADS = {
    "agent-edit": (
        "File: inventory.py\n```python\n"
        + source_file()
        + "```\n\nThe same file after changing RESTOCK_THRESHOLD from 5 to 8:\n\nFile: inventory.py\n```python\n"
    ),
    "rag-quote": (
        f"Passage:\n{PASSAGE}\n\nQuestion: Who replaced the oil lamp, when, and what else did he add? "
        'Answer by quoting the passage word for word.\n\nQuote: "'
    ),
    "free": "The history of the bicycle begins in the early nineteenth century, when",
    # Beyond the issue's three: ordinary text where drafts should not pay (Gemma 3 270M's greedy
    # prose falls into a loop within ~60 tokens, which n-gram drafts then copy): sampled at
    # temperature 0.9, seed 1. The target is the free one's: never measurably slower.
    "free-sampled": ("The history of the bicycle begins in the early nineteenth century, when", 0.9),
}
SEED = 1


def split(workload) -> tuple[str, float]:
    """(prompt, temperature) of a workload."""
    return workload if isinstance(workload, tuple) else (workload, 0.0)


# --- localrun ---------------------------------------------------------------------------------


def load_session(model: Path, threads: int, mode: str, n_slots: int = 1):
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime
    from localrun.types import Format, ModelRecord, Plan

    plan = Plan(
        runtime="llama.cpp",
        n_ctx=SLOT_CTX * n_slots,
        n_threads=threads,
        n_batch=512,
        options={"n_slots": n_slots, "slot_ctx": SLOT_CTX, "speculative": mode, "prefix_cache": False},
    )
    return LlamaCppRuntime().load(ModelRecord(name="gemma", format=Format.GGUF, path=str(model)), plan)


def localrun_one(session, workload, max_tokens: int) -> dict:
    from localrun.types import Cancel, CompletionRequest, Sampling

    prompt, temperature = split(workload)
    req = CompletionRequest(
        prompt=prompt,
        sampling=Sampling(temperature=temperature, max_tokens=max_tokens, seed=SEED if temperature else None),
    )
    first = last = None
    usage = None
    text = []
    for chunk in session.complete(req, Cancel()):
        if chunk.text:
            now = time.perf_counter()
            first = first or now
            last = now
            text.append(chunk.text)
        usage = chunk.usage or usage
    n = usage.completion_tokens
    return {
        "tokens": n,
        "rate": (n - 1) / (last - first) if last and last > first else 0.0,
        "text": "".join(text),
        "drafted": usage.drafted_tokens,
        "accepted": usage.accepted_tokens,
        "end": last,
    }


def localrun_streams(model: Path, threads: int, mode: str, prompts: list[str], max_tokens: int) -> float:
    session = load_session(model, threads, mode, n_slots=len(prompts))
    try:
        localrun_one(session, "Hello", 4)  # warm: the first plain steps are measured
        out: list = [None] * len(prompts)
        start = time.perf_counter()
        threads_ = [
            threading.Thread(target=lambda i=i: out.__setitem__(i, localrun_one(session, prompts[i], max_tokens)))
            for i in range(len(prompts))
        ]
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
        return sum(r["tokens"] for r in out) / (max(r["end"] for r in out) - start)
    finally:
        session.close()


# --- native llama.cpp ----------------------------------------------------------------------------


class Native:
    """Plain greedy decoding on the low-level API: the engine alone, on the same prompts."""

    def __init__(self, model: Path, threads: int) -> None:
        from localrun.runtimes.llamacpp.context import llama_lib

        llama = self.llama = llama_lib()
        self.model = llama.llama_model_load_from_file(str(model).encode(), llama.llama_model_default_params())
        cp = llama.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = SLOT_CTX, 512, 512
        cp.n_threads = cp.n_threads_batch = threads
        self.ctx = llama.llama_init_from_model(self.model, cp)
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.batch = llama.llama_batch_init(512, 0, 1)
        self.chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
        llama.llama_sampler_chain_add(self.chain, llama.llama_sampler_init_greedy())

    def rate(self, workload, max_tokens: int) -> float:
        from localrun.runtimes.llamacpp.decode import fill_batch

        prompt, temperature = split(workload)
        if temperature:
            return float("nan")  # a greedy loop only

        llama, ctx, batch = self.llama, self.ctx, self.batch
        llama.llama_memory_clear(llama.llama_get_memory(ctx), True)
        data = prompt.encode()
        buf = (llama.llama_token * (len(data) + 8))()
        toks = list(buf[: llama.llama_tokenize(self.vocab, data, len(data), buf, len(buf), True, True)])
        for s in range(0, len(toks), 512):
            chunk = toks[s : s + 512]
            fill_batch(batch, chunk, range(s, s + len(chunk)), 0, False)
            batch.logits[len(chunk) - 1] = True
            llama.llama_decode(ctx, batch)
        pos, n, first = len(toks), 0, None
        while n < max_tokens:
            tok = llama.llama_sampler_sample(self.chain, ctx, -1)
            first = first or time.perf_counter()
            n += 1
            if llama.llama_vocab_is_eog(self.vocab, tok):
                break
            fill_batch(batch, [tok], [pos], 0, True)
            llama.llama_decode(ctx, batch)
            pos += 1
        return (n - 1) / (time.perf_counter() - first)

    def close(self) -> None:
        llama = self.llama
        llama.llama_sampler_free(self.chain)
        llama.llama_batch_free(self.batch)
        llama.llama_free(self.ctx)
        llama.llama_model_free(self.model)


def llama_bench_tg(binary: str, model: Path, threads: int) -> float | None:
    out = subprocess.run(
        [binary, "-m", str(model), "-t", str(threads), "-p", "0", "-n", "128", "-r", "2", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = json.loads(out.stdout or "[]")
    return float(rows[0]["avg_ts"]) if rows else None


class LlamaServer:
    """One llama-server with one ``--spec-type`` setting (or none), up for the whole run so
    that its requests interleave with localrun's in every round."""

    def __init__(self, binary: str, model: Path, threads: int, spec: str | None) -> None:
        self.spec = spec
        port = free_port()
        args = [
            binary,
            "-m",
            str(model),
            "--port",
            str(port),
            "-c",
            str(SLOT_CTX),
            "-np",
            "1",
            "-t",
            str(threads),
            "-tb",
            str(threads),
        ] + (["--spec-type", *spec.split()] if spec else [])
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        wait_ready(self.proc, f"{self.url}/health")

    def one(self, workload, max_tokens: int) -> dict:
        import httpx

        prompt, temperature = split(workload)
        r = httpx.post(
            f"{self.url}/completion",
            json={
                "prompt": prompt,
                "n_predict": max_tokens,
                "temperature": temperature,
                "seed": SEED,
                "cache_prompt": False,
            },
            timeout=600,
        ).json()
        t = r.get("timings", {})
        return {
            "rate": float(t.get("predicted_per_second") or 0),
            "drafted": t.get("draft_n", 0),
            "accepted": t.get("draft_n_accepted", 0),
            "text": r.get("content", ""),
        }

    def close(self) -> None:
        stop(self.proc)


# --- one process per contender ----------------------------------------------------------------------


class Isolated:
    """A contender in its own process, as a model runs in its own worker: llama.cpp's OpenMP
    threads slow each other down when several threads of one process decode (measured here:
    a plain loop went from 62 to 45 tok/s once a second context had decoded on another
    thread of the process), which would handicap whoever shares the benchmark's process."""

    def __init__(self, kind: str, model: Path, threads: int, max_tokens: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve_contender, args=(child, kind, str(model), threads, max_tokens), daemon=True
        )
        self._proc.start()
        child.close()
        self._ask("ready")

    def _ask(self, what):
        self._conn.send(what)
        got = self._conn.recv()
        if isinstance(got, BaseException):
            raise got
        return got

    def one(self, workload) -> dict:
        return self._ask(("one", workload))

    def close(self) -> None:
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.kill()


def isolated_streams(model: Path, threads: int, mode: str, prompts: list[str], max_tokens: int) -> float:
    """:func:`localrun_streams` in a process of its own (see :class:`Isolated`)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(localrun_streams, (model, threads, mode, prompts, max_tokens))


def _serve_contender(conn, kind: str, model: str, threads: int, max_tokens: int) -> None:
    sys.path.insert(0, str(ROOT))
    if kind == "native":
        engine = Native(Path(model), threads)
        run, close = (lambda p: {"rate": engine.rate(p, max_tokens)}), engine.close
    else:
        session = load_session(Path(model), threads, kind)
        localrun_one(session, "Hello", 4)  # warm: the first plain steps are measured
        run, close = (lambda p: localrun_one(session, p, max_tokens)), session.close
    try:
        while (msg := conn.recv()) is not None:
            try:
                conn.send(True if msg == "ready" else run(msg[1]))
            except Exception as exc:  # noqa: BLE001 - handed to the parent, which stops
                conn.send(exc)
    finally:
        close()


# --- the run ---------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the median of each is kept)")
    ap.add_argument(
        "--spec-types",
        default=";".join(SERVER_SPECS),
        help="llama-server --spec-type values to try, each optionally with its flags (';'-separated)",
    )
    args = ap.parse_args()
    model, t, n = gemma_path(), args.threads, args.max_tokens
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min), {os.cpu_count()} CPUs")
    contenders = {kind: Isolated(kind, model, t, n) for kind in ("off", "auto", "native")}
    servers: list[LlamaServer] = []
    binary = os.environ.get("LLAMA_SERVER_BIN")
    for spec in [None, *[s.strip() for s in args.spec_types.split(";") if s.strip()]] if binary else []:
        try:
            servers.append(LlamaServer(binary, model, t, spec))
        except Exception as exc:  # noqa: BLE001 - an anchor that cannot run is reported, not fatal
            print(f"llama-server --spec-type {spec}: failed ({exc})")
    runs: dict[str, dict[str, list[dict]]] = {w: {} for w in WORKLOADS}
    try:
        calls = {
            **{kind: c.one for kind, c in contenders.items()},
            **{f"ls:{srv.spec or 'none'}": (lambda p, srv=srv: srv.one(p, n)) for srv in servers},
        }
        names = list(calls)
        # Every contender once per workload per round, in a rotating order: the machine is
        # shared and its speed drifts by 15 % from minute to minute, so no one gets the quiet minute.
        for r in range(args.rounds):
            for name, prompt in WORKLOADS.items():
                order = names[r % len(names) :] + names[: r % len(names)]
                for who in order:
                    runs[name].setdefault(who, []).append(calls[who](prompt))
    finally:
        for c in contenders.values():
            c.close()
        for srv in servers:
            srv.close()
    results = {w: {who: median_run(rs) for who, rs in by.items()} for w, by in runs.items()}
    for w in results:
        results[w]["same_text"] = results[w]["auto"]["text"] == results[w]["off"]["text"]
    bench = os.environ.get("LLAMA_BENCH_BIN")
    tg = llama_bench_tg(bench, model, t) if bench else None
    mixed = [WORKLOADS["agent-edit"], WORKLOADS["rag-quote"], WORKLOADS["free"], WORKLOADS["agent-edit"]]
    agg = {mode: [] for mode in ("off", "auto")}
    for _ in range(2):
        for mode in agg:
            agg[mode].append(isolated_streams(model, t, mode, mixed, n))
    report(results, tg, {m: statistics.median(v) for m, v in agg.items()})
    print(f"load after: {os.getloadavg()[0]:.2f} (1-min)")


def median_run(runs: list[dict]) -> dict:
    """The run with the median rate (its counts and text with it), and every rate."""
    ordered = sorted(runs, key=lambda r: r["rate"])
    return {**ordered[len(ordered) // 2], "rates": [round(r["rate"], 1) for r in runs]}


def report(results: dict, tg: float | None, agg: dict) -> None:
    targets = {"agent-edit": 2.0, "rag-quote": 1.5, "free": 0.97, "free-sampled": 0.97}
    servers = [k for k in next(iter(results.values())) if k.startswith("ls:")]
    print("\nmedian decode tok/s of the rounds; ls: = llama-server --spec-type ...")
    print(
        f"{'workload':<11} {'off':>7} {'auto':>7} {'native':>7} "
        + " ".join(f"{k[:14]:>14}" for k in servers)
        + "   auto/off  target  accepted/drafted  same"
    )
    for name, r in results.items():
        off, auto = r["off"], r["auto"]
        ratio = auto["rate"] / off["rate"] if off["rate"] else 0.0
        acc = f"{auto['accepted']}/{auto['drafted']}" + (
            f" ({100 * auto['accepted'] / auto['drafted']:.0f} %)" if auto["drafted"] else ""
        )
        print(
            f"{name:<11} {off['rate']:>7.1f} {auto['rate']:>7.1f} {r['native']['rate']:>7.1f} "
            + " ".join(f"{r[k]['rate']:>14.1f}" for k in servers)
            + f"   {ratio:>7.2f}x  {targets[name]:>5}x  {acc:>16}  {r['same_text']}"
        )
    for name, r in results.items():
        print(
            f"  {name}: rates per round " + "; ".join(f"{k} {v['rates']}" for k, v in r.items() if isinstance(v, dict))
        )
    spec = [k for k in servers if k != "ls:none"]
    for name, r in results.items():
        if "ls:none" in r:
            print(f"{name}: localrun off / llama-server plain = {r['off']['rate'] / r['ls:none']['rate']:.2f}x")
        if spec:
            best = max(spec, key=lambda k: r[k]["rate"])
            print(
                f"{name}: auto / llama-server's best n-gram speculation ({best[3:]}) = "
                f"{r['auto']['rate'] / r[best]['rate']:.2f}x" + (" (target 1.5x)" if name == "agent-edit" else "")
            )
    for k in spec:
        print(
            f"  llama-server --spec-type {k[3:]}: "
            + ", ".join(f"{w} {r[k]['accepted']}/{r[k]['drafted']} accepted" for w, r in results.items())
        )
    if tg:
        print(f"llama-bench tg128: {tg:.1f} tok/s (no prompt context)")
    print(
        f"4 streams (a, b, c, a): off {agg['off']:.1f} tok/s, auto {agg['auto']:.1f} tok/s "
        f"= {agg['auto'] / agg['off']:.2f}x (target >= 1.0x)"
    )


if __name__ == "__main__":
    main()
