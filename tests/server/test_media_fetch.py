"""Remote image URLs (localrun.server.media_fetch): off by default (a 400 saying how to allow the host
or send the image inline, and nothing fetched), fetched from an allowed host — a local 127.0.0.1
server here — with redirects to a host not allowed refused, and the size and time caps enforced."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from localrun.server.media_fetch import host_allowed
from tests.server.media_samples import MEDIA_CAPS, note, png

PIC = png((6, 6))


class _Handler(BaseHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def _send(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(key.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.hits.append(self.path)
        port = self.server.server_address[1]
        routes = {
            "/cat.png": lambda: self._send(200, PIC, Content_Type="image/png"),
            "/octet": lambda: self._send(200, PIC, Content_Type="application/octet-stream"),
            "/hop": lambda: self._send(302, Location="/cat.png"),
            "/away": lambda: self._send(302, Location=f"http://localhost:{port}/cat.png"),
            "/loop": lambda: self._send(302, Location="/loop"),
            "/html": lambda: self._send(200, b"<html>hello</html>", Content_Type="text/html"),
            "/big": lambda: self._send(200, PIC + bytes(100_000), Content_Type="image/png"),
        }
        if self.path in routes:
            routes[self.path]()
        elif self.path == "/unsized":  # no Content-Length: counted as it arrives
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(PIC + bytes(100_000))
            self.close_connection = True
        elif self.path == "/drip":
            self.send_response(200)
            self.send_header("Content-Length", "40000")
            self.end_headers()
            for _ in range(40):
                self.wfile.write(b"\x00")
                self.wfile.flush()
                time.sleep(0.1)
        else:
            self._send(404, b"no")


@pytest.fixture(scope="module")
def images_host():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _chat(client, url: str):
    content = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"model": "tiny", "max_tokens": 30, "messages": [{"role": "user", "content": content}]}
    return client.post("/v1/chat/completions", json=body)


def test_off_by_default_nothing_is_fetched_and_the_400_says_what_to_do(app_client, images_host):
    _Handler.hits.clear()
    r = _chat(app_client(MEDIA_CAPS), f"{images_host}/cat.png")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "messages[0].content[1]" and "fetches no image URLs" in err["message"]
    assert "data: URL" in err["message"] and "server.fetch_image_urls" in err["message"]
    assert _Handler.hits == []


def test_an_allowed_host_is_fetched_and_checked_like_inline_data(app_client, images_host):
    client = app_client(MEDIA_CAPS, fetch_image_urls=["127.0.0.1"])
    r = _chat(client, f"{images_host}/cat.png")
    assert r.status_code == 200, r.text
    assert note(("image/png", PIC)) in r.json()["choices"][0]["message"]["content"]
    r = _chat(client, f"{images_host}/octet")  # a generic Content-Type: the bytes decide
    assert r.status_code == 200, r.text
    r = _chat(client, f"{images_host}/hop")  # a redirect within the allowed host
    assert r.status_code == 200, r.text


def test_anthropic_url_sources_use_the_same_rule(app_client, images_host):
    client = app_client(MEDIA_CAPS, fetch_image_urls=["127.0.0.1"])
    block = {"type": "image", "source": {"type": "url", "url": f"{images_host}/cat.png"}}
    body = {"model": "tiny", "max_tokens": 30, "messages": [{"role": "user", "content": [block]}]}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 200 and note(("image/png", PIC)) in r.json()["content"][0]["text"]
    block["source"]["url"] = "http://example.invalid/cat.png"
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 400 and "'example.invalid' is not in server.fetch_image_urls" in r.text


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("/away", "redirects to"),
        ("/loop", "redirects more than"),
        ("/html", "not an image or audio clip"),
        ("/nothing-here", "HTTP 404"),
        ("/big", "server.max_media_bytes"),
        ("/unsized", "server.max_media_bytes"),
        ("/drip", "server.fetch_timeout_s"),
    ],
)
def test_fetch_refusals(app_client, images_host, path, needle):
    client = app_client(MEDIA_CAPS, fetch_image_urls=["127.0.0.1"], max_media_bytes=50_000, fetch_timeout_s=1.0)
    started = time.monotonic()
    r = _chat(client, images_host + path)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"], r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "messages[0].content[1]"
    if path == "/drip":
        assert time.monotonic() - started < 3.5  # the deadline covers the whole body, not each read


def test_host_patterns():
    assert host_allowed("https://img.example.com/a.png", ["*.example.com"])
    assert not host_allowed("https://example.com.evil.net/a.png", ["*.example.com", "example.com"])
    assert host_allowed("http://[::1]:8000/a.png", ["[::1]"])
    assert not host_allowed("file:///etc/passwd", ["*"])
    assert not host_allowed("https://a.example.com/x", [])
