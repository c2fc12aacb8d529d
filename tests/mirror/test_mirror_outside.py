"""A real ``localrun serve --mirror`` as another machine sees it: the Range unit in any case
(RFC 9110 §14.1), and error answers that never carry a path of the mirror host.

Before: ``Range: Bytes=0-9`` was a 416, and a file that changed, shrank or vanished on host
A was refused with its absolute path (``/home/…/hf/hub/models--…/blobs/<sha>``) in
``X-Error-Message`` and in the JSON body.
"""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from tests.hub import repos
from tests.mirror.hosts import TINY_REPO, start_serve
from tests.mirror.test_mirror_faults import GGUF, raw
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def serve_mirror(fresh_home):
    port = free_port()
    proc, seen = start_serve(fresh_home, port, "--mirror", "--runtime", "fake", until="HF_ENDPOINT=")
    url = f"http://127.0.0.1:{port}"
    assert f"HF_ENDPOINT={url}" in seen, seen[-2000:]
    yield url
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)


@pytest.mark.parametrize("unit", ["Bytes", "BYTES", "bYtEs"])
def test_range_unit_is_case_insensitive(serve_mirror, unit):
    data = repos.gguf_repo_files()["Tiny-Q4_K_M.gguf"]
    n = len(data)
    for rng, start, end in ((f"{unit}=0-9", 0, 10), (f"{unit}=-7", n - 7, n), (f"{unit}={n - 3}-", n - 3, n)):
        status, h, body = raw(serve_mirror, "GET", GGUF, {"Range": rng})
        assert status == 206 and body == data[start:end], rng
        assert h["content-range"] == f"bytes {start}-{end - 1}/{n}"
    assert raw(serve_mirror, "GET", GGUF, {"Range": "items=0-9"})[0] == 416  # another unit is still refused


def _assert_no_host_path(home, status: int, headers: dict, body: bytes, *needles: str) -> None:
    message = headers["x-error-message"]
    text = body.decode("utf-8", "replace")
    root = home.parent  # the test's folder: host A's home and the imported file's own folder
    for secret in {str(root), os.path.realpath(root), "/hf/hub/", "blobs/", "snapshots/", "own-tiny"}:
        assert secret not in message and secret not in text, (secret, message, text)
    for needle in needles:
        assert needle in message, message


def test_errors_never_name_a_path_of_the_mirror_host(serve_mirror, fresh_home):
    url = serve_mirror
    gguf = next((fresh_home / "hf/hub/models--testorg--Tiny-GGUF/snapshots").glob("*/Tiny-Q4_K_M.gguf"))
    assert raw(url, "HEAD", GGUF)[0] == 200
    blob = os.path.realpath(gguf)
    with open(blob, "r+b") as f:  # a byte flipped at rest: a hash mismatch
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    for method in ("HEAD", "GET"):
        status, h, body = raw(url, method, GGUF)
        assert status == 409
        _assert_no_host_path(fresh_home, status, h, body, "Tiny-Q4_K_M.gguf", "sha256")

    listing = httpx.get(f"{url}/api/models/{TINY_REPO}/tree/main").json()
    name = next(e["path"] for e in listing if e["path"].endswith(".gguf"))
    tiny = f"/{TINY_REPO}/resolve/main/{name}"
    assert raw(url, "HEAD", tiny)[0] == 200
    disk = fresh_home.parent / "own-tiny" / name  # imported in place: it stays in its own folder
    os.truncate(disk, disk.stat().st_size - 10)  # a size that no longer matches
    status, h, body = raw(url, "GET", tiny)
    assert status == 409
    _assert_no_host_path(fresh_home, status, h, body, name, "bytes")
    disk.unlink()  # gone
    status, h, body = raw(url, "GET", tiny)
    assert status >= 400
    _assert_no_host_path(fresh_home, status, h, body, name)


def test_redaction_keeps_what_is_not_a_host_path():
    from localrun.server.mirror.errors import redact_paths

    assert redact_paths("no route GET /api/models/x on this mirror") == "no route GET /api/models/x on this mirror"
    assert redact_paths("see http://10.0.0.5:8740/org/repo") == "see http://10.0.0.5:8740/org/repo"
    assert (
        redact_paths(f"cannot write {os.path.realpath('/tmp')}/a/b.incomplete: x") == "cannot write .../b.incomplete: x"
    )
    assert redact_paths(r"C:\Users\alice\model.gguf is 3 bytes") == ".../model.gguf is 3 bytes"
