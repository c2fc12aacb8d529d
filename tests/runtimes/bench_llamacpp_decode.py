"""Decode speed of localrun's llama.cpp session against llama-cpp-python's own ``Llama``.

Not a test (nothing asserts on speed): run it by hand on a quiet machine and read the
ratio. Both sides run in this one process, on the same file, with the same threads,
alternating rounds so drifting machine load hits both alike. On a busy machine the tok/s
swing wildly (ggml threads spin when they lose their cores); the per-token time spent
*outside* ``llama_decode`` (Python, sampling, detokenizing) is the steadier number, and it
is what separates a wrapper from native speed.

    python -m tests.runtimes.bench_llamacpp_decode [GGUF] [--tokens 128] [--threads 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from localrun.runtimes.llamacpp.session import LlamaCppRuntime
from localrun.types import Cancel, CompletionRequest, Format, ModelRecord, Plan, Sampling

PROMPT = "Once upon a time"


def _ours(session, n: int) -> tuple[float, float]:
    start, first, count = time.perf_counter(), None, 0
    for chunk in session.complete(
        CompletionRequest(prompt=PROMPT, sampling=Sampling(max_tokens=n, temperature=0.0)), Cancel()
    ):
        if first is None:
            first = time.perf_counter()
        if chunk.usage:
            count = chunk.usage.completion_tokens
    return (count - 1) / (time.perf_counter() - first), first - start


def _theirs(llm, n: int) -> tuple[float, float]:
    start, first, count = time.perf_counter(), None, 0
    for _ in llm.create_completion(PROMPT, max_tokens=n, temperature=0.0, stream=True):
        if first is None:
            first = time.perf_counter()
        count += 1
    return (count - 1) / (time.perf_counter() - first), first - start


class _DecodeClock:
    """Times every llama_decode call, whichever module path the caller uses."""

    def __init__(self) -> None:
        import llama_cpp
        import llama_cpp.llama_cpp as low

        self.seconds = 0.0
        original = low.llama_decode

        def timed(*args):
            t = time.perf_counter()
            try:
                return original(*args)
            finally:
                self.seconds += time.perf_counter() - t

        llama_cpp.llama_decode = low.llama_decode = timed

    def outside_us_per_token(self, run, *args) -> float:
        self.seconds = 0.0
        start = time.perf_counter()
        rate, _ = run(*args)
        total = time.perf_counter() - start
        return rate, (total - self.seconds) / args[-1] * 1e6


def main(argv: list[str] | None = None) -> int:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    path = args.gguf
    if path is None:
        from tests.conftest import GEMMA_CACHE

        path = str(GEMMA_CACHE / "gemma-3-270m-Q4_K_M.gguf")
    # Same attention setting on both sides: Llama disables flash attention by default.
    plan = Plan(runtime="llama.cpp", n_ctx=2048, n_threads=args.threads, options={"flash_attn": False})
    session = LlamaCppRuntime().load(ModelRecord(name="bench", format=Format.GGUF, path=path), plan)
    llm = llama_cpp.Llama(path, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    _ours(session, 16), _theirs(llm, 16)  # warm-up
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(_ours(session, args.tokens))
        theirs.append(_theirs(llm, args.tokens))
    clock = _DecodeClock()
    outside_ours = statistics.median(clock.outside_us_per_token(_ours, session, args.tokens)[1] for _ in range(3))
    outside_theirs = statistics.median(clock.outside_us_per_token(_theirs, llm, args.tokens)[1] for _ in range(3))
    o = statistics.median(r for r, _ in ours)
    t = statistics.median(r for r, _ in theirs)
    sys.stdout.write(
        f"decode tok/s (median of {args.rounds}, {args.tokens} tokens, {args.threads} threads)\n"
        f"  localrun session : {o:6.1f}   rounds {[round(r, 1) for r, _ in ours]}\n"
        f"  llama_cpp.Llama  : {t:6.1f}   rounds {[round(r, 1) for r, _ in theirs]}\n"
        f"  ratio            : {o / t:6.3f}\n"
        f"  TTFT ms (median) : {statistics.median(f for _, f in ours) * 1000:.0f} vs "
        f"{statistics.median(f for _, f in theirs) * 1000:.0f}\n"
        f"  time outside llama_decode per token (median of 3): {outside_ours:.0f} us vs {outside_theirs:.0f} us\n"
    )
    session.close()
    llm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
