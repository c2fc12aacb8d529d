"""A hostile hub ends ``pull``'s listing with a message, never a traceback or a full memory:
a page that links to itself, a page of millions of empty lists, a redirect loop, JSON nested
200,000 deep, and a body drip-fed just inside the stall deadline (an overall deadline cuts it).

Before: ``get_pages`` kept up to a thousand pages before validating any (a page linking to itself
OOM-killed ``pull`` at 3.2 GB), 64 MiB of ``[],`` parsed into 21 million lists, and a redirect
loop (``httpx.TooManyRedirects``) and deep JSON (``RecursionError``) escaped as tracebacks."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from localrun.errors import DownloadFailed
from localrun.modelstore.hub import HubClient
from tests.support.launch import launch_env

COMMIT = "a" * 40
ENTRY = b'{"type":"file","oid":"' + b"b" * 40 + b'","size":1,"path":"x%d.txt"}'


class Hostile(BaseHTTPRequestHandler):
    mode = ""

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: bytes, status: int = 200, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        host = f"http://127.0.0.1:{self.server.server_address[1]}"
        if "/revision/" in self.path:
            if self.mode == "redirect":
                self.send_response(302)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            return self._send(b'{"sha":"%s"}' % COMMIT.encode())
        if self.mode == "self-link":  # a full page, linking to itself
            page = b"[" + b",".join(ENTRY % k for k in range(1000)) + b"]"
            return self._send(page, Link=f'<{host}{self.path}>; rel="next"')
        if self.mode == "lists":
            return self._send(b"[" + b"[]," * (8 << 20) + b"[]]")
        if self.mode == "deep":
            return self._send(b"[" * 200_000 + b"]" * 200_000)
        if self.mode == "drip":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            for byte in b"[" + b" " * 100:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.3)  # inside the 1 s stall deadline, forever
            return None
        return self._send(b"[]")


@pytest.fixture
def hub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _list(hub, mode: str, settings=None) -> tuple[DownloadFailed, int]:
    Hostile.mode = mode
    client = HubClient(endpoint=f"http://127.0.0.1:{hub.server_address[1]}", token="", settings=settings)
    tracemalloc.start()
    try:
        with pytest.raises(DownloadFailed) as info:
            client.list_repo("org/repo")
        return info.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_page_linking_to_itself_stops_at_the_listing_bound(hub):
    err, peak = _list(hub, "self-link")
    assert "100,000 entries in all" in err.message
    assert peak < 400 << 20, f"{peak:,} bytes"


def test_a_page_of_millions_of_empty_lists_is_refused_before_it_is_parsed(hub):
    err, peak = _list(hub, "lists")
    assert "more values than a listing page has" in err.message
    assert peak < 200 << 20, f"{peak:,} bytes"  # the 24 MB body, not 1.75 GB of lists


def test_a_redirect_loop_and_deep_json_are_messages(hub):
    assert "redirected" in _list(hub, "redirect")[0].message
    assert "not JSON (or nests too deeply)" in _list(hub, "deep")[0].message


def test_a_drip_feeding_hub_is_cut_by_the_overall_deadline(hub):
    from localrun.settings import Settings

    settings = Settings(hub={"stall_timeout_s": 1.0, "listing_timeout_s": 3.0})
    started = time.monotonic()
    err, _ = _list(hub, "drip", settings)
    assert "took more than 3 s" in err.message and time.monotonic() - started < 15


def test_cli_pull_from_a_redirect_loop_exits_with_a_message_not_a_traceback(hub, tmp_path):
    Hostile.mode = "redirect"
    env = launch_env(tmp_path / "home")
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{hub.server_address[1]}"
    proc = subprocess.run(
        [sys.executable, "-m", "localrun", "pull", "org/repo"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "redirected" in proc.stderr, proc.stderr[-2000:]
