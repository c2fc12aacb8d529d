"""The llama.cpp worker's peak memory with many of the largest allowed pictures in one request.

    python benchmarks/bench_media_rss.py [--counts 1,8,32] [--fit 1605632] [--projector tiny] [--threads 2]

Each count runs in a fresh process that loads Gemma 3 270M Q4_K_M with a fixture projector
(tests/support/vision.py) in the process, as the worker does, then sends one chat request with
that many 64-MP PNGs (8000 × 8000, a flat colour each: ~190 KB of file, 192 MB of RGB at full
size), greedy, one token. It prints the process's peak RSS (``VmHWM``) after the load and after
the request, the time to the first token, and the most bytes of bitmaps the projector held at
once (``Projector.bitmaps``; absent before it existed).

``--fit`` is the pixels a picture keeps (``plan.options["media"]["decode_pixels"]``); the default
is Gemma 3's SigLIP (2 × 896²), so each picture reaches the worker as 4.8 MB of RGB whatever
projector encodes it. The tiny projector preprocesses to 64 px and encodes in milliseconds, so
what is measured is what the worker holds between decoding and encoding; SigLIP-400M
(``--projector siglip400m``) adds its own preprocessed copy per chunk (896² × 3 float32, 9.6 MB)
and minutes of encoding on a CPU: ``--tokenize-only`` builds the prompt (every chunk
preprocessed, as the scheduler holds it until each is encoded) and encodes nothing.

Say ``uptime`` with the numbers: this machine is shared.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIDE = 8000  # 64,000,000 pixels: the largest picture the door and the decoder take


def hwm() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def png(k: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (SIDE, SIDE), (k * 7 % 256, 255 - k * 5 % 256, k * 11 % 256)).save(buf, "PNG")
    return buf.getvalue()


def one(count: int, folder: Path, fit: int, projector_name: str, threads: int, tokenize_only: bool) -> dict:
    from benchmarks.common import gemma_path
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime
    from localrun.types import MEDIA_MARKER, Cancel, ChatRequest, Media, Message, Plan, Sampling
    from tests.support import vision

    files = [(folder / f"{k}.png").read_bytes() for k in range(count)]  # made by the parent: not in this HWM
    media = tuple(Media("image", data, "image/png") for data in files)
    pair = vision.VisionPair(gemma_path(), vision.vision_projector(vision.VISION_SHAPES[projector_name]))
    options = {"n_slots": 1, "media": {"decode_pixels": fit}}
    session = LlamaCppRuntime().load(
        pair.record(), Plan(runtime="llama.cpp", n_ctx=4096, n_threads=threads, options=options)
    )
    try:
        msg = Message("user", MEDIA_MARKER * count + " What is in them?", media=media)
        req = ChatRequest(messages=(msg,), sampling=Sampling(temperature=0.0, max_tokens=1))
        list(session.chat(ChatRequest(messages=(Message("user", "Hi"),), sampling=req.sampling), Cancel()))
        loaded = hwm()
        started, cpu = time.perf_counter(), time.process_time()
        first = None
        if tokenize_only:  # the prompt as the scheduler gets it: every chunk preprocessed, none encoded
            session.prompting.media_prompt(msg.content, media, add_special=True).close()
        else:
            for _ in session.chat(req, Cancel()):
                first = first if first is not None else time.perf_counter() - started
        projector = session._media.projector
        counted = getattr(projector, "bitmaps", None)
        return {
            "count": count,
            "file_bytes": sum(len(d) for d in files),
            "hwm_loaded_mib": round(loaded / 2**20),
            "hwm_after_mib": round(hwm() / 2**20),
            "ttft_s": round(first or 0.0, 2),
            "worker_cpu_s": round(time.process_time() - cpu, 2),  # this process's, not the decoder child's
            "bitmap_peak_mb": round(counted.peak / 1e6, 1) if counted is not None else None,
        }
    finally:
        session.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", default="1,8,32")
    parser.add_argument("--fit", type=int, default=2 * 896 * 896)
    parser.add_argument("--projector", default="tiny", choices=("tiny", "siglip400m"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokenize-only", action="store_true", help="build the prompt, encode nothing")
    parser.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, Path(args.folder), args.fit, args.projector, args.threads, args.tokenize_only)))
        return
    counts = [int(c) for c in args.counts.split(",")]
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min), fit {args.fit:,} px, projector {args.projector}")
    with tempfile.TemporaryDirectory(prefix="bench-media-rss-") as tmp:
        for k in range(max(counts)):
            Path(tmp, f"{k}.png").write_bytes(png(k))
        for count in counts:
            cmd = [sys.executable, __file__, "--one", str(count), "--folder", tmp, "--fit", str(args.fit)]
            cmd += ["--projector", args.projector, "--threads", str(args.threads)]
            cmd += ["--tokenize-only"] if args.tokenize_only else []
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            print(out.strip().splitlines()[-1], flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f} (1-min)")


if __name__ == "__main__":
    main()
