"""What one image costs before the text model sees it: decoding (in the decoder's child process and,
for comparison, in this one) and the projector's encode, tiny and SigLIP-400M-sized.

    python benchmarks/bench_media_decode.py [--threads 2] [--rounds 5] [--no-siglip]

Prints medians. The child round trip = decode through MediaDecoder − the same decode in-process:
the pipe, the copies and the framing. Encode = ``mtmd_encode_chunk`` of one image on the random-
weight fixture projector paired with Gemma 3 270M (tests/support/vision.py), ``--threads`` threads.
Not a test: nothing asserts on speed; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def photo_like(size=(1024, 768)) -> np.ndarray:
    """Smooth gradients with mild noise: compresses like a photo, unlike pure noise."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rng = np.random.default_rng(0)
    img = np.stack([x / w * 255, y / h * 255, (x + y) / (w + h) * 255], axis=-1)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def encoded(pixels: np.ndarray, fmt: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def median_ms(fn, rounds: int) -> tuple[float, float]:
    """Median wall and CPU (this process's, all threads) milliseconds of ``fn``. On a shared machine
    the CPU time is the steadier number: wall time there is mostly waiting for a core."""
    fn()  # warm
    walls, cpus = [], []
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


def bench_decode(rounds: int) -> None:
    from localrun.runtimes.llamacpp.media import formats as F
    from localrun.runtimes.llamacpp.media.decoder import MediaDecoder

    pixels = photo_like()
    tiny = encoded(np.zeros((1, 1, 3), np.uint8), "PNG")
    import psutil

    with MediaDecoder() as decoder:
        decoder.image(tiny)  # the child is up
        proc = psutil.Process(next(iter(decoder._all)).proc.pid)

        def child_cpu() -> float:
            t = proc.cpu_times()
            return t.user + t.system

        for fmt in ("JPEG", "PNG"):
            data = encoded(pixels, fmt)
            wall, cpu = median_ms(lambda d=data: F.decode_image(d, 64_000_000), rounds)
            before = child_cpu()
            child, parent_cpu = median_ms(lambda d=data: decoder.image(d), rounds)
            in_child = (child_cpu() - before) / (rounds + 1) * 1000
            print(
                f"1024x768 {fmt} ({len(data) / 1e3:.0f} kB): in-process {wall:.1f} ms wall ({cpu:.1f} ms CPU); "
                f"via the child {child:.1f} ms wall ({in_child:.1f} ms CPU in the child + {parent_cpu:.1f} ms here)"
            )
        wall, cpu = median_ms(lambda: F.decode_image(tiny, 64_000_000), rounds)
        child, _ = median_ms(lambda: decoder.image(tiny), rounds)
        print(f"1x1 PNG: in-process {wall:.2f} ms, via the child {child:.2f} ms: round trip ≈ {child - wall:.2f} ms")


def bench_encode(threads: int, rounds: int, siglip: bool) -> None:
    import llama_cpp

    from benchmarks.common import gemma_path
    from tests.runtimes.test_vision_fixture import Mtmd
    from tests.support import vision as V

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(gemma_path()).encode(), llama_cpp.llama_model_default_params())
    shapes = [V.TINY] + ([V.SIGLIP400M] if siglip else [])
    for shape in shapes:
        path = V.vision_projector(shape)
        mtmd = Mtmd(model, path, n_threads=threads)
        pixels = photo_like((shape.image_size, shape.image_size))
        n = rounds if shape is V.TINY else 1
        walls, cpus, tokens = [], [], 0
        for _ in range(n + 1):  # the first round warms the graph allocator; it is not counted
            c = time.process_time()
            got = mtmd.encode(mtmd.image_bitmap(pixels))  # tokenize (resize, normalise) + encode
            cpus.append(time.process_time() - c)
            walls.append(got["encode_s"])
            tokens = got["n_tokens"]
        mtmd.close()
        wall, cpu = (statistics.median(x[1:]) * 1000 for x in (walls, cpus))
        size = path.stat().st_size / 1e6
        print(
            f"{shape.name} ({size:.1f} MB, {tokens} tokens), {threads} threads: encode {wall:.1f} ms wall, "
            f"{cpu:.1f} ms CPU (all threads)"
        )
    llama_cpp.llama_model_free(model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-siglip", action="store_true", help="skip the SigLIP-400M-sized encode (slow on CPU)")
    args = ap.parse_args()
    bench_decode(args.rounds)
    bench_encode(args.threads, args.rounds, not args.no_siglip)


if __name__ == "__main__":
    main()
