"""`localrun --help` wall time (target ≤ 150 ms: heavy imports deferred), next to the bare
interpreter start in the same run, so the ratio survives a busy machine.

    python benchmarks/bench_cli_startup.py [--runs 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def wall(cmd: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    exe = shutil.which("localrun") or f"{sys.prefix}/bin/localrun"
    rows = {
        "python -c pass": wall([sys.executable, "-c", "pass"], args.runs),
        "localrun --help": wall([exe, "--help"], args.runs),
        "localrun run --help": wall([exe, "run", "--help"], args.runs),
    }
    base = statistics.median(rows["python -c pass"])
    print(f"{'command':<22}{'p50 ms':>9}{'min ms':>9}{'÷ python':>10}")
    for name, times in rows.items():
        p50 = statistics.median(times)
        print(f"{name:<22}{p50 * 1000:>9.1f}{min(times) * 1000:>9.1f}{p50 / base:>10.2f}")
    p50 = statistics.median(rows["localrun --help"]) * 1000
    print(f"\nlocalrun --help p50 {p50:.0f} ms (target ≤ 150 ms): {'met' if p50 <= 150 else 'MISSED'}")


if __name__ == "__main__":
    main()
