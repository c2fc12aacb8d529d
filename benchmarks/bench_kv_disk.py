"""The prompt cache on disk: what a restart, a keep-alive unload and a new Claude Code session
cost with it, beside llama-server's own slot save/restore, and what writing it costs decoding.

    python benchmarks/bench_kv_disk.py [--threads 2] [--tokens 16000] [--skip restart,anchor,claude,streams,hybrid]
    LLAMA_SERVER_BIN=.../llama-server   (the anchor; default: what scripts/build-llama-server --native built)
    CLAUDE_BIN=.../claude               (default: the suite's .cache/npm-agents, PATH, or npm install into a temp dir)

Gemma 3 270M Q4_K_M (32k context; sliding-window), ``--threads`` threads, greedy, every request
streamed and timed at the client, each TTFT with the model already loaded (the load is printed
beside it). Every server is a real ``localrun serve`` configured by environment alone, stopped
with SIGTERM; each phase has a KV directory (``cache.kv_dir``) of its own in a temporary folder.

1. **Restart and unload.** An agent-shaped ``--tokens`` prefix (rules, a JSON tool list, a first
   user turn; benchmarks/kv_agent_prompt.py): cold TTFT; SIGTERM; a new server on the same
   directory; the same request: TTFT ÷ cold (target <= 0.1) and usage's ``cached_tokens``. Then a
   second prefix on that server, cold; wait for the keep-alive (``--ttl``) to unload the model;
   reload; the same request: TTFT ÷ its cold one (target <= 0.1).
2. **llama-server beside it** (``--slot-save-path``, ``--swa-full``, one slot): the first prefix
   cold, ``POST /slots/0?action=save``, restart, ``restore``, the request; its save, restore,
   request TTFT and restore + TTFT; localrun's restart TTFT ÷ that (target <= 1).
3. **A new Claude Code session after a restart.** ``claude -p`` headless against a capturing
   server (its text stays in the temporary folder, never in the repository): the first
   request's shape (system prompt, tools, first user turn) replayed through ``/v1/messages``
   cold; restart; a second ``claude -p`` session's first request replayed: TTFT ÷ cold (target
   <= 0.1). Without Claude Code, the same shape from its documented tool list (said so).
4. **Writes beside decoding.** Four slots; a fourth slot holds a ``--tokens`` prefix; three
   streams decode; a newcomer takes the fourth slot, evicting that state, which the disk tier
   writes. The three streams' tok/s over ``--window`` seconds from the newcomer's send, against
   the same run with ``cache.kv_disk_bytes = 0`` (target >= 0.95). Host RAM tier off in both
   (``cache.kv_ram_bytes = 0``), so the state goes to disk, or nowhere.
5. **Hybrid models**: benchmarks/kv_hybrid.py's ``run(threads)``, when it is there.

Every number is printed with its target; a missed target is reported, not an error (exit 0).
Say ``uptime`` with the numbers: this machine is shared.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import kv_agent_prompt as prompts  # noqa: E402
from benchmarks.common import gemma_path  # noqa: E402
from benchmarks.kv_servers import (  # noqa: E402
    RUNNING,
    LlamaServer,
    Localrun,
    cached,
    chat,
    complete,
    dir_bytes,
    messages,
    settle,
    ttft,
)

DISK_WORDS = ("disk", "kv_")
STREAM_PROMPTS = (
    "Write a long story about a lighthouse keeper, in many paragraphs.",
    "Explain, step by step and at length, how a steam engine works.",
    "List one hundred facts about the sea, one per line.",
)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"load {os.getloadavg()[0]:.2f} (1 min)"


def verdict(value: float, target: float, *, most: bool) -> str:
    ok = value <= target if most else value >= target
    return f"(target {'<=' if most else '>='} {target}{'' if ok else ': MISSED'})"


def mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def show_disk(server: Localrun, label: str) -> None:
    """The disk tier's /metrics lines and the directory's size, for the note."""
    try:
        lines = server.metrics_lines(*DISK_WORDS)
    except Exception as exc:  # noqa: BLE001 - a missing counter must not end the run
        lines = [f"(/metrics unreadable: {exc})"]
    print(f"  {label}: {server.kv_dir.name} holds {mb(dir_bytes(server.kv_dir))}")
    for line in lines[:12]:
        print(f"    {line}")


# --- 1. restart and keep-alive unload -------------------------------------------------------------


def part_restart(args, home: Path, tmp: Path) -> dict:
    kv = tmp / "kv-agent"
    first = Localrun(home, kv, args.threads, args.ctx)
    first.start()
    load = first.load()
    msgs, n = prompts.sized_messages(first.count, args.tokens, seed=1)
    cold = chat(first.url, msgs, args.answer)
    print(f"restart: agent prefix of {n} tokens (counted; {cold['usage'].get('prompt_tokens')} in usage)")
    print(f"  cold TTFT {ttft(cold):.2f} s (model load before it {load:.2f} s), cached_tokens {cached(cold)}")
    show_disk(first, "before SIGTERM")
    took = first.stop()
    print(f"  SIGTERM to exit: {took:.2f} s; {kv.name} then held {mb(dir_bytes(kv))}")
    landed = settle(kv)
    print(f"  the state landed {landed:.2f} s after the exit ({mb(dir_bytes(kv))}; a restart sooner misses it)")

    second = Localrun(home, kv, args.threads, args.ctx, keep_alive_s=args.ttl)
    up = second.start()
    load = second.load()
    hot = chat(second.url, msgs, args.answer)
    ratio = ttft(hot) / ttft(cold)
    print(f"  restarted: up {up:.2f} s, model load {load:.2f} s, TTFT {ttft(hot):.3f} s, cached_tokens {cached(hot)}")
    print(
        f"  first token {up + load + ttft(hot):.2f} s after the start; "
        f"same greedy answer: {hot['text'] == cold['text']}"
    )
    print(f"  restart TTFT / cold TTFT: {ratio:.3f} {verdict(ratio, 0.1, most=True)}")
    show_disk(second, "after the restarted request")

    msgs2, n2 = prompts.sized_messages(second.count, args.tokens, seed=2)
    cold2 = chat(second.url, msgs2, args.answer)
    print(f"unload: a second prefix of {n2} tokens, cold TTFT {ttft(cold2):.2f} s; keep-alive {args.ttl:g} s")
    t0 = time.perf_counter()
    while second.loaded() and time.perf_counter() - t0 < args.ttl + 300:
        time.sleep(0.5)
    gone = time.perf_counter() - t0
    landed = settle(kv)
    print(f"  after the unload the KV folder changed for {landed:.2f} s more")
    print(f"  unloaded {gone:.1f} s after the answer (loaded still: {second.loaded()}); {kv.name}: {mb(dir_bytes(kv))}")
    reload = second.load()
    back = chat(second.url, msgs2, args.answer)
    ratio2 = ttft(back) / ttft(cold2)
    print(f"  reloaded in {reload:.2f} s; TTFT {ttft(back):.3f} s, cached_tokens {cached(back)}, "
          f"same answer: {back['text'] == cold2['text']}")  # fmt: skip
    print(f"  after-unload TTFT / cold TTFT: {ratio2:.3f} {verdict(ratio2, 0.1, most=True)}")
    show_disk(second, "after the unload")
    second.stop()
    return {"messages": msgs, "hot_ttft": ttft(hot), "cold_ttft": ttft(cold)}


# --- 2. llama-server's slot save / restore ---------------------------------------------------------


def default_llama_server() -> str | None:
    cache = Path(os.environ.get("LOCALRUN_TEST_CACHE", Path.home() / ".cache" / "localrun-test"))
    found = sorted(cache.glob("llama.cpp-*/build-native/bin/llama-server"))
    return str(found[-1]) if found else None


def part_anchor(args, model: Path, tmp: Path, restart: dict | None) -> None:
    binary = os.environ.get("LLAMA_SERVER_BIN") or default_llama_server()
    if not binary:
        print("llama-server skipped: build it with scripts/build-llama-server --native or set LLAMA_SERVER_BIN")
        return
    msgs = restart["messages"] if restart else prompts.agent_messages(args.tokens // 2, 1)
    slots = tmp / "llama-slots"
    slots.mkdir()
    ls = LlamaServer(binary, model, args.threads, args.ctx, slots)
    ls.start()
    try:
        cold = chat(ls.url, msgs, args.answer)
        save_s, saved = ls.slot("save", "agent.bin")
        ls.stop()
        up = ls.start()
        restore_s, restored = ls.slot("restore", "agent.bin")
        hot = chat(ls.url, msgs, args.answer)
    finally:
        if ls.proc is not None:
            ls.stop()
    path = restore_s + ttft(hot)
    print(f"llama-server: prompt {cold['usage'].get('prompt_tokens')} tokens, cold TTFT {ttft(cold):.2f} s")
    print(f"  save {save_s:.3f} s ({saved.get('n_saved')} tokens, {saved.get('n_written', 0) / 2**20:.1f} MiB, "
          f"save_ms {(saved.get('timings') or {}).get('save_ms')}); restart up {up:.2f} s")  # fmt: skip
    print(
        f"  restore {restore_s:.3f} s ({restored.get('n_restored')} tokens); request TTFT {ttft(hot):.3f} s "
        f"(cache_n {cached(hot)}); restore + TTFT {path:.3f} s; same answer: {hot['text'] == cold['text']}"
    )
    print(f"  its restart TTFT / its cold: {path / ttft(cold):.3f}")
    if restart:
        ratio = restart["hot_ttft"] / path
        print(f"  localrun restart TTFT / llama-server restore + TTFT: {ratio:.3f} {verdict(ratio, 1.0, most=True)}")


# --- 3. a new Claude Code session ------------------------------------------------------------------


def replay(body: dict, answer: int) -> dict:
    """Claude Code's request as it came, but for our model and a short answer."""
    return {**body, "model": "gemma", "max_tokens": answer, "stream": True}


def part_claude(args, home: Path, tmp: Path) -> None:
    claude, where = prompts.find_claude(tmp)
    if claude is None:
        print(f"claude code: not available ({where}); the shape from its documented tool list instead")
        first = second = prompts.claude_code_fallback()
    else:
        first = prompts.capture_claude_code(claude, tmp / "claude-a")
        second = None
        print(f"claude code: first request captured from `claude -p` ({where}): {len(first['tools'])} tools")
    kv = tmp / "kv-claude"
    server = Localrun(home, kv, args.threads, args.ctx)
    server.start()
    server.load()
    cold_ttft, usage = messages(server.url, replay(first, args.answer))
    total = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
    print(f"  cold: {total} prompt tokens, TTFT {cold_ttft:.2f} s")
    server.stop()
    print(f"  the state landed {settle(kv):.2f} s after the exit")
    if second is None:  # a new session of the same user in the same project, another question
        second = prompts.capture_claude_code(
            claude, tmp / "claude-a", task="List the files in this folder and say what each one is for."
        )
    server.start()
    load = server.load()
    hot_ttft, usage = messages(server.url, replay(second, args.answer))
    total = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
    ratio = hot_ttft / cold_ttft
    print(
        f"  new session after a restart: {total} prompt tokens, {usage.get('cache_read_input_tokens')} read "
        f"from the cache, TTFT {hot_ttft:.3f} s (model load {load:.2f} s)"
    )
    print(f"  new-session TTFT / cold TTFT: {ratio:.3f} {verdict(ratio, 0.1, most=True)}")
    show_disk(server, "claude phase")
    server.stop()


# --- 4. decoding while a state is written ----------------------------------------------------------


def streams_scenario(args, home: Path, kv: Path, disk_bytes: int | None) -> dict:
    server = Localrun(home, kv, args.threads, args.stream_ctx, parallel=4, disk_bytes=disk_bytes, ram_bytes=0)
    seen = worker_logs(home)
    server.start()
    server.load()
    try:
        big, n = prompts.sized_messages(server.count, args.tokens, seed=10)
        chat(server.url, big, 1)  # the fourth slot's content, idle once answered
        before = dir_bytes(kv)
        results: list[dict | None] = [None, None, None]
        firsts = [threading.Event() for _ in range(3)]

        def run(i: int) -> None:
            results[i] = complete(server.url, STREAM_PROMPTS[i], args.stream_tokens, started=firsts[i])

        workers = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for w in workers:
            w.start()
        for f in firsts:
            f.wait(600)
        time.sleep(args.settle)  # all three past their (short) prefills, decoding
        watch = Watch(kv, before)
        newcomer = chat(server.url, [{"role": "user", "content": "Name a colour."}], 4)
        for w in workers:
            w.join()
        watch.stop()
        written = dir_bytes(kv) - before
    finally:
        server.stop()
    # what the eviction cost the scheduler thread, as the worker logged it
    saves = [
        line.split("prompt cache: ", 1)[1]
        for line in new_log_lines(home, seen)
        if "prompt cache: slot" in line and " leaves " in line
    ]
    times = [r["times"] for r in results if r]
    start = newcomer["sent"]
    return {
        "tokens": n,
        "during": rate_in(times, start, start + args.window),
        "before": rate_in(times, start - args.window, start),
        "written": written,
        "write_after": None if watch.grew_at is None else watch.grew_at - start,
        "write_done": None if watch.done_at is None else watch.done_at - start,
        "ended_early": min((t[-1] for t in times if t), default=0) < start + args.window,
        "saves": saves,
    }


def worker_logs(home: Path) -> dict[Path, int]:
    """The workers' log files under ``home`` and their sizes now (a later run appends to them)."""
    return {p: p.stat().st_size for p in home.rglob("worker-*.log")}


def new_log_lines(home: Path, seen: dict[Path, int]) -> list[str]:
    lines: list[str] = []
    for path in home.rglob("worker-*.log"):
        with open(path, "rb") as f:
            f.seek(seen.get(path, 0))
            lines += f.read().decode("utf-8", "replace").splitlines()
    return lines


class Watch:
    """When the KV directory first grows past ``before`` (a state is being written) and when it
    last grew, sampled every 50 ms on a thread of its own while the streams run."""

    def __init__(self, kv: Path, before: int) -> None:
        self.kv, self.before = kv, before
        self.grew_at: float | None = None
        self.done_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = self.before
        while not self._stop.wait(0.05):
            size = dir_bytes(self.kv)
            if size > last:
                now = time.perf_counter()
                self.grew_at = self.grew_at or now
                self.done_at = now
                last = size

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def rate_in(streams: list[list[float]], start: float, end: float) -> float:
    n = sum(1 for times in streams for t in times if start <= t <= end)
    return n / (end - start) if end > start else 0.0


def part_streams(args, home: Path, tmp: Path) -> None:
    on = streams_scenario(args, home, tmp / "kv-streams-on", None)
    off = streams_scenario(args, home, tmp / "kv-streams-off", 0)
    for label, r in (("disk tier on", on), ("disk tier off", off)):
        early = "; a stream ended inside it" if r["ended_early"] else ""
        seen = (
            "none seen"
            if r["write_after"] is None
            else f"growing from {r['write_after']:.2f} s to {r['write_done']:.2f} s after the send"
        )
        print(f"  {label}: 3 streams {r['during']:.1f} tok/s in the {args.window:g} s window ({r['before']:.1f} "
              f"before it); {mb(r['written'])} written ({seen}){early}")  # fmt: skip
        for line in r["saves"]:
            print(f"    {line}")
    if not on["written"]:
        print("  the disk-on run wrote no state during the window: this ratio measures nothing yet")
    ratio = on["during"] / off["during"] if off["during"] else 0.0
    print(
        f"writes beside decoding ({on['tokens']}-token state): tok/s with / without the disk tier: "
        f"{ratio:.3f} {verdict(ratio, 0.95, most=False)}"
    )
    if on["before"] and off["before"] and off["during"]:
        # each run's window against its own seconds before it: what is left of the ratio when the
        # shared machine's speed drifted between the two runs
        drift = (on["during"] / on["before"]) / (off["during"] / off["before"])
        print(f"  the same, each run's window / its {args.window:g} s before: {drift:.3f}")


# --- 5. hybrid models ------------------------------------------------------------------------------


def part_hybrid(args) -> None:
    if not (ROOT / "benchmarks" / "kv_hybrid.py").exists():
        print("hybrid: benchmarks/kv_hybrid.py is not here yet: skipped")
        return
    result = importlib.import_module("benchmarks.kv_hybrid").run(args.threads)
    print("hybrid (benchmarks/kv_hybrid.py):")
    for key, value in (result or {}).items():
        print(f"  {key}: {value}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16000, help="the agent prefix's length in tokens")
    parser.add_argument("--ctx", type=int, default=32768, help="context of the restart and Claude Code servers")
    parser.add_argument("--stream-ctx", type=int, default=20480, help="context per slot of the four-slot server")
    parser.add_argument("--answer", type=int, default=8, help="tokens each timed request decodes")
    parser.add_argument("--ttl", type=float, default=10.0, help="keep-alive of the unload case, seconds")
    parser.add_argument("--stream-tokens", type=int, default=600)
    parser.add_argument(
        "--settle", type=float, default=6.0, help="seconds from the streams' first tokens to the newcomer"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=10.0,
        help="seconds of decoding measured from the newcomer (the write takes longer)",
    )
    parser.add_argument("--skip", default="", help="comma-separated: restart,anchor,claude,streams,hybrid")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, state files)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    model = gemma_path()
    print(f"bench_kv_disk: {model.name}, {args.threads} threads, {os.cpu_count()} CPUs; {uptime()}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-kv-disk-"))
    home = tmp / "home"
    home.mkdir()
    try:
        Localrun(home, tmp / "kv", args.threads, args.ctx).import_model(model)
        print("model imported and verified (`localrun verify` records the sha256 the disk tier keys by)")
        restart = None
        parts = (
            ("restart", lambda: part_restart(args, home, tmp)),
            ("anchor", lambda: part_anchor(args, model, tmp, restart)),
            ("claude", lambda: part_claude(args, home, tmp)),
            ("streams", lambda: part_streams(args, home, tmp)),
            ("hybrid", lambda: part_hybrid(args)),
        )
        for name, part in parts:
            if name in skip:
                continue
            try:
                result = part()
            except Exception as exc:  # noqa: BLE001 - one part failing must not lose the others' numbers
                print(f"{name}: FAILED: {type(exc).__name__}: {exc}")
                continue
            if name == "restart":
                restart = result
    finally:
        for server in list(RUNNING):  # what a failed part left running
            server.stop()
        print(f"done; {uptime()}")
        if args.keep:
            print(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
