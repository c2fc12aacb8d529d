"""The hub mirror, measured: host B pulling from host A, HEAD latency, 32 clients at once.

    python benchmarks/bench_mirror.py [--size-mib 256] [--rounds 2]

Host A and host B are network namespaces joined by a veth pair (as in tests/mirror; run as
root), or loopback where namespaces are not allowed (it says so). A's store holds one
model of SIZE MiB; ``localrun mirror`` serves it. Printed, with targets:

* pull ÷ plain copy ≥ 0.8 — B's whole ``localrun pull`` (list, download, sha256 while
  streaming, fsync, rename, register) against a bare HTTP streaming copy of the same bytes
  from the same mirror to a file in the same folder; best of N rounds each. ``cp`` of the
  file on A is shown for reference.
* HEAD p50 ≤ 5 ms — 500 HEADs of the file from B on one keep-alive connection.
* 32 clients ÷ 1 client ≥ 0.8 (loopback) — aggregate rate of 32 concurrent downloads
  (32 MiB each, Range) against one client's rate on the whole file; raw sockets in one
  asyncio loop, so the client side costs little.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEY = "bench-mirror-key"
REPO = "local/big"

B_SCRIPT = r"""
import json, os, sys, time, statistics, httpx
url, key, rounds, work = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
auth = {"Authorization": f"Bearer {key}"}
file_url = f"{url}/local/big/resolve/main/big-Q4_K_M.gguf"
plain, pulled = [], []
for k in range(rounds):
    dest = os.path.join(work, f"plain-{k}")
    t = time.perf_counter()
    headers = {**auth, "Accept-Encoding": "identity"}
    with httpx.Client(timeout=60) as c, c.stream("GET", file_url, headers=headers) as r, open(dest, "wb") as f:
        r.raise_for_status()
        for chunk in r.iter_raw():
            f.write(chunk)
    plain.append(time.perf_counter() - t)
    os.unlink(dest)
    os.environ.update(LOCALRUN_HOME=os.path.join(work, f"b{k}"), HF_HOME=os.path.join(work, f"b{k}", "hf"))
    from localrun.modelstore.pull import pull
    from localrun.modelstore.store import ModelStore
    from localrun.settings import load_settings
    t = time.perf_counter()
    pull(ModelStore(load_settings()), "local/big")
    pulled.append(time.perf_counter() - t)
heads = []
with httpx.Client(timeout=10, headers=auth) as c:
    for _ in range(520):
        t = time.perf_counter()
        c.head(file_url).raise_for_status()
        heads.append(time.perf_counter() - t)
print(json.dumps({"plain": plain, "pull": pulled, "heads": heads[20:]}))
"""


async def _get(host: str, port: int, path: str, start: int, end: int | None) -> int:
    """One GET on a raw socket (bytes counted, not kept); returns the body length."""
    reader, writer = await asyncio.open_connection(host, port)
    rng = f"Range: bytes={start}-{'' if end is None else end}\r\n" if end is not None or start else ""
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept-Encoding: identity\r\n"
    writer.write((request + f"{rng}Connection: close\r\n\r\n").encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    got = 0
    while got < length:
        block = await reader.read(1 << 20)
        if not block:
            break
        got += len(block)
    writer.close()
    return got


async def _concurrent(host: str, port: int, path: str, size: int) -> tuple[float, float]:
    t = time.perf_counter()
    one = await _get(host, port, path, 0, None)
    single = one / (time.perf_counter() - t)
    part = min(32 << 20, size)
    t = time.perf_counter()
    got = await asyncio.gather(*(_get(host, port, path, 0, part - 1) for _ in range(32)))
    aggregate = sum(got) / (time.perf_counter() - t)
    return single, aggregate


def _make_home(work: Path, size: int) -> tuple[Path, Path]:
    from tests.hub.repos import make_gguf
    from tests.mirror.hosts import home_env

    home = work / "host-a"
    src = work / "src" / "big-Q4_K_M.gguf"
    src.parent.mkdir(parents=True)
    src.write_bytes(make_gguf(payload=size, seed=1))
    subprocess.run(
        [sys.executable, "-m", "localrun", "import", str(src), "--name", "big"],
        env=home_env(home),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return home, src


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from tests.mirror.hosts import home_env, start_mirror
    from tests.support.netns import two_hosts
    from tests.support.servers import free_port

    work = Path(tempfile.mkdtemp(prefix="bench-mirror-"))
    try:
        home, src = _make_home(work, args.size_mib << 20)
        size = src.stat().st_size
        t = time.perf_counter()
        shutil.copyfile(src, work / "cp-copy")
        cp_s = time.perf_counter() - t
        os.unlink(work / "cp-copy")
        with two_hosts() as hosts:
            port = free_port()
            mp = start_mirror(home, host=hosts.a_ip, port=port, key=KEY, prefix=hosts.a_prefix or None)
            url = f"http://{hosts.a_ip}:{port}"
            time.sleep(2.0)
            bwork = work / "host-b"
            bwork.mkdir()
            env = {**home_env(bwork), "HF_ENDPOINT": url, "HF_TOKEN": KEY}
            warm = (
                "import httpx,sys,time\nfor _ in range(300):\n try:\n  "
                "httpx.head(sys.argv[1],headers={'Authorization':'Bearer '+sys.argv[2]},timeout=120)"
                ".raise_for_status(); break\n except Exception: time.sleep(0.2)"
            )
            subprocess.run(
                [*hosts.b_prefix, sys.executable, "-c", warm, f"{url}/{REPO}/resolve/main/big-Q4_K_M.gguf", KEY],
                env=env,
                check=True,
                timeout=300,
            )  # the first HEAD hashes A's file (its sha256 was never recorded)
            out = subprocess.run(
                [*hosts.b_prefix, sys.executable, "-c", B_SCRIPT, url, KEY, str(args.rounds), str(bwork)],
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            mp.stop()
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            res = json.loads(out.stdout)
            where = "veth between two network namespaces" if hosts.isolated else "LOOPBACK (namespaces unavailable)"
        lp = start_mirror(home)  # loopback, no key: the concurrency figure
        try:
            single, aggregate = asyncio.run(
                _concurrent("127.0.0.1", int(lp.url.rsplit(":", 1)[1]), f"/{REPO}/resolve/main/big-Q4_K_M.gguf", size)
            )
        finally:
            lp.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mib = size / (1 << 20)
    plain, pulled = min(res["plain"]), min(res["pull"])
    heads = sorted(res["heads"])
    p50, p90 = statistics.median(heads) * 1e3, heads[int(len(heads) * 0.9)] * 1e3
    print(f"bench_mirror: {mib:.0f} MiB model, B from A over {where}; load: {os.getloadavg()[0]:.2f} (1-min)")
    print(f"  plain HTTP copy   {mib / plain:8.0f} MiB/s   ({plain:.2f} s, best of {args.rounds})")
    print(f"  localrun pull     {mib / pulled:8.0f} MiB/s   ({pulled:.2f} s: list, sha256, fsync, register)")
    print(f"  cp on A (ref.)    {mib / cp_s:8.0f} MiB/s")
    print(f"  pull ÷ plain      {plain / pulled:8.2f}      target ≥ 0.8")
    print(f"  HEAD p50 / p90    {p50:8.2f} / {p90:.2f} ms   target p50 ≤ 5 ms")
    print(f"  1 client          {single / (1 << 20):8.0f} MiB/s (loopback)")
    print(f"  32 clients        {aggregate / (1 << 20):8.0f} MiB/s aggregate")
    print(f"  32 ÷ 1            {aggregate / single:8.2f}      target ≥ 0.8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
