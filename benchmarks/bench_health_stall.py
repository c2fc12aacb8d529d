"""How long ``/health`` waits while large media requests are read, parsed and checked.

    python benchmarks/bench_health_stall.py [--rounds 3]

Starts the server on the fake runtime (declaring vision) with the tiny GGUF, then for each case
sends one request from a thread while another client asks ``/health`` in a loop (10 ms apart) and
prints the longest and the median round trip of ``/health`` over ``--rounds`` rounds:

* ``19 MB image``: one PNG padded to 19 MiB with an ancillary chunk (25 MB of base64);
* ``32 x 1 MiB``: the largest request the door takes (``max_items`` images of 1 MiB each,
  ``max_total_bytes`` in all: a 43 MB JSON body);
* ``3 MB fill JPEG``: a valid JPEG with 3 MiB of 0xFF fill bytes before its first marker (Pillow's
  header parser spends seconds in Python on it).

Not a test: tests/server/test_media_off_loop.py asserts a bound with margin for a loaded CI box.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1 << 20


def padded_png(total: int) -> bytes:
    """A valid 16x16 PNG grown to ``total`` bytes by an unknown, safe-to-copy chunk (CRC right)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), "blue").save(buf, "PNG")
    png = buf.getvalue()
    pad = bytes(total - len(png) - 12)
    kind = b"zzZz"
    chunk = len(pad).to_bytes(4, "big") + kind + pad + zlib.crc32(kind + pad).to_bytes(4, "big")
    return png[:33] + chunk + png[33:]


def filled_jpeg(fill: int = 3 * MiB) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buf, "JPEG")
    jpeg = buf.getvalue()
    return jpeg[:2] + b"\xff" * fill + jpeg[2:]


def chat_body(images: list[bytes], mime: str) -> dict[str, Any]:
    parts = [
        {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(i).decode()}"}}
        for i in images
    ]
    return {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": parts}]}


def post_raw(url: str, path: str, payload: bytes) -> int:
    """POST ``payload`` (JSON) on a plain socket; the status. ``sendall`` releases the GIL for the
    whole send, so the client's own process never delays its /health probe (httpx would encode
    and frame the body holding it)."""
    host, _, port = url.removeprefix("http://").partition(":")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        sock.sendall(head.encode())
        sock.sendall(payload)
        answer = b""
        while b"\r\n" not in answer:
            got = sock.recv(4096)
            if not got:
                break
            answer += got
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def longest_health_wait(url: str, send) -> tuple[float, float, int]:
    """(longest, median) /health round trip while ``send`` runs in a thread, and its status."""
    import httpx

    answer: list[int] = []
    worker = threading.Thread(target=lambda: answer.append(send()))
    waits: list[float] = []
    with httpx.Client(base_url=url, timeout=60) as probe:
        probe.get("/health")
        worker.start()
        while worker.is_alive():
            t = time.perf_counter()
            probe.get("/health")
            waits.append(time.perf_counter() - t)
            time.sleep(0.01)
    worker.join()
    return max(waits), statistics.median(waits), answer[0]


def main() -> None:
    from tests.factories import write_tiny_llama_gguf
    from tests.server.media_samples import MEDIA_CAPS
    from tests.support import servers

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    cases = {
        "19 MB image": chat_body([padded_png(19 * MiB)], "image/png"),
        "32 x 1 MiB": chat_body([padded_png(MiB)] * 32, "image/png"),
        "3 MB fill JPEG": chat_body([filled_jpeg()], "image/jpeg"),
    }
    payloads = {name: json.dumps(body).encode() for name, body in cases.items()}
    with tempfile.TemporaryDirectory() as tmp:
        gguf = write_tiny_llama_gguf(Path(tmp) / "tiny.gguf")
        proc = servers.start_in_home(Path(tmp) / "home", gguf, "tiny", fake_capabilities=list(MEDIA_CAPS))
        try:
            print(f"{'case':<16} {'body MB':>8} {'longest s':>10} {'median s':>9} status")
            for name, payload in payloads.items():
                for _ in range(args.rounds):

                    def send(payload: bytes = payload) -> int:
                        return post_raw(proc.url, "/v1/chat/completions", payload)

                    longest, median, status = longest_health_wait(proc.url, send)
                    print(f"{name:<16} {len(payload) / 1e6:>8.1f} {longest:>10.3f} {median:>9.3f} {status}")
        finally:
            proc.stop()


if __name__ == "__main__":
    main()
