"""10,000 requests with made-up method names, and refused Hosts, against a real ``localrun serve``:
the metrics keep a bounded set of labels, so the server's memory and ``/metrics`` stay flat.

Before the labels were bounded, each method name became a series: 10,000 of them added 75 MB of
RSS and made ``/metrics`` 93 MB. ``-s`` shows the RSS figures.
"""

from __future__ import annotations

import random
import socket
import string
from pathlib import Path

import httpx
import pytest

from tests.support import servers

FLOOD = 10_000
WARM_UP = 2_000
#: Requests written at once on one kept-alive connection (pipelined), then all their answers read.
BATCH = 200
RSS_SLACK_KB = 5 * 1024


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _flood(port: int, count: int, rng: random.Random) -> dict[int, int]:
    """``count`` requests, each with a random method name; every third one with a refused Host.
    Returns how many answers had each status."""
    statuses: dict[int, int] = {}
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    reader = sock.makefile("rb")
    try:
        for start in range(0, count, BATCH):
            n = min(BATCH, count - start)
            out = []
            for i in range(n):
                method = "".join(
                    rng.choices(string.ascii_uppercase, k=rng.randint(64, 2048))
                )  # long: each one was a series
                host = "evil.example" if (start + i) % 3 == 0 else f"localhost:{port}"
                path = "/api/tags" if i % 2 else f"/{''.join(rng.choices(string.ascii_lowercase, k=12))}"
                out.append(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n")
            sock.sendall("".join(out).encode())
            for _ in range(n):
                status = int(reader.readline().split()[1])
                length = 0
                while (line := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                reader.read(length)
                statuses[status] = statuses.get(status, 0) + 1
    finally:
        reader.close()
        sock.close()
    return statuses


@pytest.fixture
def serve_process(tmp_path):
    home = tmp_path / "flood-home"
    home.mkdir()
    spec = servers.localrun_serve(servers.free_port(), home=home)
    spec.env["LOCALRUN_LOG_LEVEL"] = "ERROR"  # the refused Hosts are each a warning: not what is measured
    proc = servers.start(spec, home / "server.log")
    yield proc
    proc.stop()


def test_random_methods_leave_memory_and_metrics_flat(serve_process):
    port, pid = serve_process.spec.port, serve_process.pid
    rng = random.Random(21)
    _flood(port, WARM_UP, rng)
    before = _rss_kb(pid)
    statuses = _flood(port, FLOOD, rng)
    after = _rss_kb(pid)
    metrics = httpx.get(f"{serve_process.url}/metrics", timeout=10).text
    print(
        f"\nRSS before {before / 1024:.1f} MB, after {FLOOD} requests {after / 1024:.1f} MB "
        f"(delta {(after - before) / 1024:+.2f} MB); /metrics {len(metrics)} bytes; statuses {statuses}"
    )
    assert sum(statuses.values()) == FLOOD and 403 in statuses  # every request answered, the refused Hosts too
    assert after - before < RSS_SLACK_KB
    series = [line for line in metrics.splitlines() if line.startswith("localrun_requests_total{")]
    assert len(metrics) < 20_000 and len(series) < 20, series
    other = [line for line in series if 'method="other"' in line]
    assert other and sum(int(line.rsplit(" ", 1)[1]) for line in other) == FLOOD + WARM_UP
    assert {'route="other"', 'route="/api/tags"'} == {line.split(",")[0].split("{")[1] for line in other}
