"""Images in localrun's llama.cpp runtime: the prefix cache, encoding beside decoding, and
llama-server on the same model, projector and image, in one run.

    python benchmarks/bench_vision.py [--threads 2] [--projector siglip400m|tiny] [--rounds 3]
    LLAMA_SERVER_BIN=.../llama-server   (the anchor; default: what scripts/build-llama-server --native built)

Gemma 3 270M Q4_K_M + a random-weight Gemma 3 projector from tests/support/vision.py (default
SigLIP-400M's shape: 27 blocks, 1152 wide, 896 px, 256 tokens an image; the tiny one encodes too
fast to show anything), 2 threads, greedy, every request streamed and timed at the client.

1. Turn-2 TTFT with the same image ÷ turn-1 TTFT (a two-turn chat whose first user message holds
   the image; median over ``--rounds`` images). Target <= 0.1: turn 2 finds the image's KV in the
   prefix cache (keyed by the decoded bitmap's digest) and encodes nothing.
2. Three text streams decoding while a fourth request's image is encoded: their aggregate tok/s
   between the fourth request's send and its first token ÷ the same three streams' tok/s with no
   image (target >= 0.7), and their longest gap between two tokens in that window against
   2 × the median gap + one image's encode time (the encode time: an image request's TTFT minus
   the same text's, on an idle server). localrun encodes on a thread of its own while the
   scheduler keeps stepping (runtimes/llamacpp/media/prefill.py); llama-server encodes inside its
   slot loop, so every stream waits for an image there.
3. Image-request TTFT ÷ llama-server's (``--mmproj``, same image, cache off by a fresh image per
   round, median over ``--rounds``). Target <= 1.05.

Say ``uptime`` with the numbers: this machine is shared.
"""

from __future__ import annotations

import argparse
import base64
import io
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port, gemma_path, greedy_chat_body, post_chat_stream, stop, wait_ready  # noqa: E402

MODEL = "gemma-vision"
#: The context localrun splits among its 4 slots: each stream needs room for ``--stream-tokens``
#: tokens that outlast one image's encode of a real-size projector (about two minutes here).
CTX = 16384
TEXT_PROMPTS = (
    "Write a long story about a lighthouse keeper, in many paragraphs.",
    "Explain, step by step and at length, how a steam engine works.",
    "List one hundred facts about the sea, one per line.",
)


def image_url(seed: int, size: tuple[int, int] = (640, 480)) -> str:
    """A data URL of a PNG whose pixels depend on ``seed`` (each seed a new image: no cache hit)."""
    from PIL import Image

    rng = random.Random(seed)
    small = Image.new("RGB", (32, 24))
    small.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(32 * 24)])
    out = io.BytesIO()
    small.resize(size, Image.Resampling.BILINEAR).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def user(text: str, seed: int | None = None) -> dict:
    if seed is None:
        return {"role": "user", "content": text}
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": image_url(seed)}}],
    }


def stream_chat(url: str, messages: list, max_tokens: int, *, model: str = MODEL, ignore_eos: bool = False) -> dict:
    """One streamed chat: send time, each content chunk's arrival time, the text and the usage."""

    body = greedy_chat_body(model, messages, max_tokens, ignore_eos=ignore_eos)
    return post_chat_stream(url, body, timeout=900)


def stream_completion(url: str, prompt: str, n_predict: int) -> dict:
    """One streamed raw ``/completion`` of exactly ``n_predict`` tokens (``ignore_eos``): a chat
    stream ends early where the template's stop strings show up in a base model's text."""
    import httpx

    body = {"model": MODEL, "prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "stream": True}
    body["temperature"] = 0
    sent = time.perf_counter()
    times: list[float] = []
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=900) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("content"):
                times.append(time.perf_counter())
    return {"sent": sent, "times": times, "text": "", "usage": {}}


def ttft(result: dict) -> float:
    return result["times"][0] - result["sent"]


# --- the servers ---------------------------------------------------------------------------------


def start_localrun(model: Path, projector: Path, home: Path, threads: int) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, LOCALRUN_HOME=str(home), LOCALRUN_RUNTIME__THREADS=str(threads), PYTHONPATH=str(ROOT))
    env["LOCALRUN_RUNTIME__CONTEXT_LENGTH"] = str(CTX)
    env.pop("LOCALRUN_RUNTIME__FORCE", None)
    subprocess.run(
        [sys.executable, "-m", "localrun", "import", str(model), "--mmproj", str(projector), "--name", MODEL],
        env=env,
        check=True,
        capture_output=True,
    )
    port = free_port()
    log = open(home / "serve.log", "wb")  # noqa: SIM115 - the server's lifetime, closed with the run
    proc = subprocess.Popen(
        [sys.executable, "-m", "localrun", "serve", "--no-default-model", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{url}/health")
    return proc, url


def start_llama_server(binary: str, model: Path, projector: Path, threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [binary, "-m", str(model), "--mmproj", str(projector), "--port", str(port), "-c", str(CTX)]
    args += ["-np", "1", "-t", str(threads), "-tb", str(threads), "--alias", MODEL]
    # localrun loads without weight repacking; with it, ggml's AMX kernels die on this VM (SIGILL:
    # the CPU lists AMX but the tile state is not granted), so both sides load the same way.
    args += ["--no-repack"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{url}/health")
    return proc, url


def default_llama_server() -> str | None:
    cache = Path(os.environ.get("LOCALRUN_TEST_CACHE", Path.home() / ".cache" / "localrun-test"))
    found = sorted(cache.glob("llama.cpp-*/build-native/bin/llama-server"))
    return str(found[-1]) if found else None


# --- the measurements ----------------------------------------------------------------------------


def turn_two(url: str, rounds: int, seed0: int) -> list[tuple[float, float, int, int]]:
    """(turn-1 TTFT, turn-2 TTFT, image tokens counted in turn 1, tokens cached in turn 2) per round."""
    out = []
    for i in range(rounds):
        first = [user(f"Round {i}: what is in this picture?", seed=seed0 + i)]
        one = stream_chat(url, first, 8)
        convo = [*first, {"role": "assistant", "content": one["text"] or "ok"}, user("And what else?")]
        two = stream_chat(url, convo, 8)
        cached = ((two["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
        out.append((ttft(one), ttft(two), one["usage"].get("prompt_tokens", 0), cached))
    return out


def encode_time(url: str, seed: int) -> float:
    """One image's cost on an idle server: its request's TTFT minus the same text's."""
    text = "Describe this picture in a word."
    plain = ttft(stream_chat(url, [user(text)], 1))
    seen = ttft(stream_chat(url, [user(text, seed=seed)], 1))
    return max(0.0, seen - plain)


def three_streams(url: str, max_tokens: int, image_seed: int | None) -> dict:
    """Three text streams; with ``image_seed``, a fourth request with that image sent once all
    three are in flight and a second into decoding. Each stream's token times, and the fourth's."""
    results: list[dict | None] = [None, None, None]

    def run(i: int) -> None:
        results[i] = stream_completion(url, TEXT_PROMPTS[i], max_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    fourth = None
    deadline = time.monotonic() + 120
    while image_seed is not None and time.monotonic() < deadline:
        time.sleep(0.25)
        if _all_decoding(url):
            time.sleep(1.0)  # past their prefills
            fourth = stream_chat(url, [user("What is in this picture?", seed=image_seed)], 4)
            break
    for t in threads:
        t.join()
    return {"streams": [r["times"] for r in results if r], "fourth": fourth}


def _all_decoding(url: str) -> bool:
    """Whether three requests are in flight and past their prefill (the server's /health count)."""
    import httpx

    try:
        models = httpx.get(f"{url}/health", timeout=5).json().get("models") or []
    except (httpx.TransportError, ValueError):
        return False
    return sum(m.get("in_flight", 0) for m in models) >= 3


def rate_in(streams: list[list[float]], start: float, end: float) -> float:
    n = sum(1 for times in streams for t in times if start <= t <= end)
    return n / (end - start) if end > start else 0.0


def gaps(times: list[float]) -> list[tuple[float, float]]:
    """(gap, when it ended) for each pair of consecutive tokens."""
    return [(b - a, b) for a, b in zip(times, times[1:], strict=False)]


def report_cache(url: str, rounds: int) -> None:
    results = turn_two(url, rounds, seed0=100)
    for a, b, counted, cached in results:
        print(f"turn 1 TTFT {a:.3f} s ({counted} prompt tokens), turn 2 {b:.3f} s ({cached} cached)")
    ratio = statistics.median(b / a for a, b, _, _ in results)
    print(f"turn-2 TTFT / turn-1 TTFT (median): {ratio:.3f}  (target <= 0.1)")


def report_streams(url: str, rounds: int, stream_tokens: int) -> None:
    enc = statistics.median(encode_time(url, 200 + i) for i in range(rounds))
    print(f"one image's encode (image TTFT - text TTFT, idle): {enc:.3f} s")
    base = three_streams(url, stream_tokens, None)
    busy = three_streams(url, stream_tokens, 300)
    fourth = busy["fourth"]
    if fourth is None:
        print("three streams: the fourth request never found all three decoding")
        return
    start, end = fourth["sent"], fourth["times"][0]
    alive = sum(1 for times in busy["streams"] if times and times[-1] >= end)
    print(f"streams still decoding when the encode ended: {alive} of 3 (else raise --stream-tokens)")
    during = rate_in(busy["streams"], start, end)
    # the same stretch of the baseline run, placed as far from its first token
    b0 = min(t[0] for t in base["streams"] if t) + (start - min(t[0] for t in busy["streams"] if t))
    without = rate_in(base["streams"], b0, b0 + (end - start))
    median_gap = statistics.median(g for times in base["streams"] for g, _ in gaps(times))
    longest = max((g for times in busy["streams"] for g, at in gaps(times) if start <= at <= end + 1), default=0.0)
    print(f"encode window {end - start:.3f} s; 3 streams {during:.1f} tok/s during it, {without:.1f} without")
    print(f"aggregate tok/s during an encode / without: {during / without:.3f}  (target >= 0.7)")
    bound = 2 * median_gap + enc
    print(f"longest gap {longest:.3f} s; 2 x median gap {median_gap:.3f} s + encode {enc:.3f} s = {bound:.3f} s")
    print(f"longest gap / that bound: {longest / bound:.3f}  (target <= 1)")


def report_anchor(url: str, model: Path, projector: Path, threads: int, rounds: int) -> None:
    binary = os.environ.get("LLAMA_SERVER_BIN") or default_llama_server()
    if not binary:
        print("llama-server skipped: build it with scripts/build-llama-server --native or set LLAMA_SERVER_BIN")
        return
    ls_proc, ls_url = start_llama_server(binary, model, projector, threads)
    mine, theirs = [], []
    try:
        stream_chat(ls_url, [user("Warm up.", seed=2)], 2)
        for i in range(rounds):  # interleaved: this machine's speed drifts; a new image each time
            mine.append(ttft(stream_chat(url, [user("What is in this picture?", seed=400 + 2 * i)], 4)))
            theirs.append(ttft(stream_chat(ls_url, [user("What is in this picture?", seed=401 + 2 * i)], 4)))
    finally:
        stop(ls_proc)
    a, b = statistics.median(mine), statistics.median(theirs)
    print(f"image TTFT: localrun {a:.3f} s, llama-server {b:.3f} s (medians)")
    print(f"image TTFT localrun / llama-server: {a / b:.3f}  (target <= 1.05)")


def main() -> None:
    import httpx

    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--projector", default="siglip400m", choices=("siglip400m", "tiny"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream-tokens", type=int, default=3000)
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out: cache,streams,anchor")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    from tests.support import vision

    model = gemma_path()
    t0 = time.perf_counter()
    projector = vision.vision_projector(vision.VISION_SHAPES[args.projector])
    took = time.perf_counter() - t0
    print(f"projector {args.projector}: {projector.stat().st_size / 1e6:.0f} MB ({took:.1f} s to build or find)")
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min), {os.cpu_count()} CPUs, {args.threads} threads")
    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp:
        proc, url = start_localrun(model, projector, Path(tmp), args.threads)
        try:
            stream_chat(url, [user("Warm up.", seed=1)], 2)  # load the model and the projector
            props = httpx.get(f"{url}/props", params={"model": MODEL}, timeout=30).json()
            print(f"localrun slots: {props.get('total_slots')}")
            if "cache" not in skip:
                report_cache(url, args.rounds)
            if "streams" not in skip:
                report_streams(url, args.rounds, args.stream_tokens)
            if "anchor" not in skip:
                report_anchor(url, model, projector, args.threads, args.rounds)
        finally:
            stop(proc)
    print(f"load after: {os.getloadavg()[0]:.2f} (1-min)")


if __name__ == "__main__":
    main()
