"""Mirror faults on loopback: hostile names, unknown repo / revision / file with the hub's
status and X-Error-Code, Ranges, headers that must (never) be there, the key and Host
guards, read-only, and a file that changes on host A's disk at rest or mid-download."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from urllib.parse import quote, urlsplit

import httpx
import pytest

from tests.hub import repos
from tests.hub.hostile import HOSTILE_NAMES
from tests.mirror.hosts import home_env, start_mirror
from tests.modelstore.test_names import HOSTILE_RELPATHS
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(180)

GGUF = f"/{repos.GGUF_REPO}/resolve/main/Tiny-Q4_K_M.gguf"
EXTRA_HOSTILE = [
    "%2e%2e",
    "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "..%5c..%5cx",
    "%00",
    "....//....//x",
    "snapshots",
    "blobs",
    "refs/main",
    "../models--testorg--Tiny-GGUF/refs/main",
    "%252e%252e",
    ".locks",
    "index.sqlite3",
]
CORPUS = sorted(
    (set(HOSTILE_NAMES) | set(HOSTILE_RELPATHS) | set(EXTRA_HOSTILE)) - {""}, key=repr
)  # "" is the root folder


def raw(url: str, method: str, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """A request whose path goes out exactly as written (no client-side normalisation)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True, skip_host="Host" in (headers or {}))
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _encoded(name: str) -> str:
    return quote(name.encode("utf-8", "surrogatepass"), safe="")


def test_hostile_names_never_reach_the_disk(mirror):
    paths = []
    for name in CORPUS:
        q, plain = _encoded(name), name.encode("utf-8", "surrogatepass").decode("latin-1").replace(" ", "%20")
        plain = "".join(c if 0x21 <= ord(c) < 0x7F else quote(c.encode("latin-1")) for c in plain)
        paths += [
            f"/{repos.GGUF_REPO}/resolve/main/{q}",
            f"/{repos.GGUF_REPO}/resolve/main/{plain}",
            f"/{repos.GGUF_REPO}/resolve/{q}/Tiny-Q4_K_M.gguf",
            f"/{q}/x/resolve/main/Tiny-Q4_K_M.gguf",
            f"/testorg/{q}/resolve/main/Tiny-Q4_K_M.gguf",
            f"/api/models/{repos.GGUF_REPO}/tree/main/{q}",
            f"/api/models/{repos.GGUF_REPO}/revision/{q}",
            f"/api/models/{q}/{q}",
            f"/api/models/testorg/{q}/refs",
        ]
    for path in paths:
        for method in ("GET", "HEAD"):
            status, headers, body = raw(mirror.url, method, path)
            assert status in (400, 404), (method, path, status, body[:200])
            assert headers.get("content-type", "").startswith("application/json"), (path, headers)
    assert b"root:" not in body
    status, _, body = raw(mirror.url, "GET", GGUF)
    assert status == 200 and body == repos.gguf_repo_files()["Tiny-Q4_K_M.gguf"]  # and the real file still comes


def test_unknown_repo_revision_and_file_get_the_hub_error_codes(mirror, tmp_path):
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    cases = [
        ("/nobody/nothing/resolve/main/x.gguf", "RepoNotFound"),
        (f"/{repos.GGUF_REPO}/resolve/{'0' * 40}/Tiny-Q4_K_M.gguf", "RevisionNotFound"),
        (f"/{repos.GGUF_REPO}/resolve/no-such-branch/Tiny-Q4_K_M.gguf", "RevisionNotFound"),
        (f"/{repos.GGUF_REPO}/resolve/main/missing.gguf", "EntryNotFound"),
        ("/api/models/nobody/nothing", "RepoNotFound"),
        (f"/api/models/{repos.GGUF_REPO}/revision/v9", "RevisionNotFound"),
        (f"/api/models/{repos.GGUF_REPO}/tree/main/no-folder", "EntryNotFound"),
        ("/api/models/nobody/nothing/refs", "RepoNotFound"),
    ]
    for path, code in cases:
        for method in ("GET", "HEAD"):
            status, headers, _ = raw(mirror.url, method, path)
            assert (status, headers.get("x-error-code")) == (404, code), (method, path)
            if code == "EntryNotFound" and "/resolve/" in path:
                assert len(headers["x-repo-commit"]) == 40  # lets the client cache the miss
    kw = dict(endpoint=mirror.url, cache_dir=tmp_path / "c", token=False)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("nobody/nothing", "x.gguf", **kw)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repos.GGUF_REPO, "Tiny-Q4_K_M.gguf", revision="no-such-branch", **kw)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repos.GGUF_REPO, "missing.gguf", **kw)


def test_ranges_headers_and_no_compression(mirror):
    data = repos.gguf_repo_files()["Tiny-Q4_K_M.gguf"]
    n = len(data)
    tree = httpx.get(f"{mirror.url}/api/models/{repos.GGUF_REPO}/tree/main").json()
    etag = tree[0]["lfs"]["oid"]
    status, h, body = raw(mirror.url, "HEAD", GGUF, {"Accept-Encoding": "gzip, br"})
    assert status == 200 and body == b""
    assert h["etag"] == f'"{etag}"' and h["x-linked-etag"] == f'"{etag}"' and h["x-linked-size"] == str(n)
    assert h["content-length"] == str(n) and len(h["x-repo-commit"]) == 40 and h["accept-ranges"] == "bytes"
    assert "content-encoding" not in h and not [k for k in h if "xet" in k] and "link" not in h
    for rng, start, end in (
        ("bytes=10-19", 10, 20),
        ("bytes=-7", n - 7, n),
        (f"bytes={n - 3}-", n - 3, n),
        (f"bytes=5-{n + 100}", 5, n),
    ):
        status, h, body = raw(mirror.url, "GET", GGUF, {"Range": rng, "Accept-Encoding": "gzip"})
        assert status == 206 and body == data[start:end], rng
        assert h["content-range"] == f"bytes {start}-{end - 1}/{n}" and "content-encoding" not in h
    for rng in (f"bytes={n}-", f"bytes={n + 10}-{n + 20}", "bytes=0-1,5-6", "bytes=x-y", "items=0-1", "bytes=9-3"):
        status, h, _ = raw(mirror.url, "GET", GGUF, {"Range": rng})
        assert status == 416 and h["content-range"] == f"bytes */{n}", rng
    status, _, body = raw(mirror.url, "GET", GGUF, {"Accept-Encoding": "gzip"})
    assert status == 200 and body == data


def test_read_only_and_the_index_untouched(mirror, filled_home):
    index = filled_home / "data" / "index.sqlite3"
    before = index.read_bytes()
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        for path in (GGUF, f"/api/models/{repos.GGUF_REPO}", "/api/models"):
            status, _, _ = raw(mirror.url, method, path, {"Content-Type": "application/json", "Content-Length": "0"})
            assert status in (404, 405), (method, path, status)
    assert (
        raw(mirror.url, "GET", "/local/tiny-llama/resolve/main/tiny-llama.gguf")[0] == 200
    )  # hashed, learned in memory
    assert index.read_bytes() == before


def test_host_guard_and_key(filled_home):
    key = "mirror-test-key"
    mp = start_mirror(filled_home, key=key)
    try:
        assert raw(mp.url, "GET", GGUF)[0] == 401
        assert raw(mp.url, "GET", GGUF, {"Authorization": "Bearer wrong"})[0] == 401
        assert raw(mp.url, "GET", GGUF, {"Authorization": f"Bearer {key}"})[0] == 200
        for host in ("evil.example", "localhost.evil.example", "127.0.0.1.nip.io", "mirror.local", "[::2]"):
            assert raw(mp.url, "GET", GGUF, {"Authorization": f"Bearer {key}", "Host": host})[0] == 403, host
        assert "mirror-test-key" not in mp.log_text()
    finally:
        mp.stop()
    env = home_env(filled_home)
    done = subprocess.run(
        [sys.executable, "-m", "localrun", "mirror", "--host", "0.0.0.0", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "API key" in done.stderr


def _store_file(home, repo_dir: str, name: str):
    snaps = home / "hf" / "hub" / repo_dir / "snapshots"
    return next(snaps.glob(f"*/{name}"))


def test_revision_with_an_encoded_slash(fresh_home):
    snap = _store_file(fresh_home, "models--testorg--Tiny-GGUF", "Tiny-Q4_K_M.gguf")
    commit = snap.parent.name
    ref = fresh_home / "hf" / "hub" / "models--testorg--Tiny-GGUF" / "refs" / "refs" / "pr" / "1"
    ref.parent.mkdir(parents=True)
    ref.write_text(commit)
    mp = start_mirror(fresh_home)
    try:
        info = httpx.get(f"{mp.url}/api/models/{repos.GGUF_REPO}/revision/refs%2Fpr%2F1").json()
        assert info["sha"] == commit
        assert raw(mp.url, "GET", f"/{repos.GGUF_REPO}/resolve/refs%2Fpr%2F1/Tiny-Q4_K_M.gguf")[0] == 200
        refs = httpx.get(f"{mp.url}/api/models/{repos.GGUF_REPO}/refs", params={"include_prs": 1}).json()
        assert refs["pullRequests"] == [{"name": "1", "ref": "refs/pr/1", "targetCommit": commit}]
    finally:
        mp.stop()


def test_a_changed_file_is_refused_at_rest_and_cut_short_mid_download(fresh_home):
    """A byte flipped at rest → 409 naming the file; a change while B reads → B never gets a
    whole response (the body stops short), and the next request refuses the file."""
    big = fresh_home / "big" / "big-Q8_0.gguf"
    big.parent.mkdir()
    big.write_bytes(repos.make_gguf(quant="Q8_0", payload=48 << 20, seed=11))
    subprocess.run(
        [sys.executable, "-m", "localrun", "import", str(big), "--name", "big"],
        env=home_env(fresh_home),
        check=True,
        capture_output=True,
        timeout=120,
    )
    gguf = _store_file(fresh_home, "models--testorg--Tiny-GGUF", "Tiny-Q4_K_M.gguf")
    mp = start_mirror(fresh_home)
    try:
        assert raw(mp.url, "HEAD", GGUF)[0] == 200
        blob = os.path.realpath(gguf)
        with open(blob, "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
        for method in ("HEAD", "GET"):
            status, h, body = raw(mp.url, method, GGUF)
            assert status == 409 and "Tiny-Q4_K_M.gguf" in h["x-error-message"] and "sha256" in h["x-error-message"]
        url = f"{mp.url}/local/big/resolve/main/big-Q8_0.gguf"
        size = big.stat().st_size
        got = 0
        with pytest.raises(httpx.RemoteProtocolError):
            with httpx.stream("GET", url, timeout=60) as resp:
                assert resp.status_code == 200 and int(resp.headers["content-length"]) == size
                for chunk in resp.iter_raw(1 << 20):
                    if got == 0:
                        with open(big, "r+b") as f:  # A's file changes while B is reading it
                            f.seek(size - 10)
                            f.write(b"\xff" * 10)
                    got += len(chunk)
        assert got < size
        status, h, _ = raw(mp.url, "HEAD", "/local/big/resolve/main/big-Q8_0.gguf")
        assert status == 409 or (status == 200 and h["etag"] != ""), status  # re-hashed before anything more is served
        assert "changed on disk while it was being sent" in mp.log_text()
    finally:
        mp.stop()


def test_a_symlink_planted_in_the_store_serves_nothing_of_its_target(fresh_home, tmp_path):
    """A snapshot link of a registered file swapped for one pointing out of the store: the
    mirror follows only what the index recorded, and the bytes no longer match → refused."""
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_bytes(b"root:x:0:0:not for you\n" * 200)
    snap = _store_file(fresh_home, "models--testorg--Tiny-GGUF", "Tiny-Q4_K_M.gguf")
    snap.unlink()
    snap.symlink_to(secret)
    planted = snap.parent / "planted.txt"
    planted.symlink_to(secret)  # a file the index never registered
    mp = start_mirror(fresh_home)
    try:
        status, h, body = raw(mp.url, "GET", GGUF)
        assert status == 409 and b"not for you" not in body and "Tiny-Q4_K_M.gguf" in h["x-error-message"]
        status, h, body = raw(mp.url, "GET", f"/{repos.GGUF_REPO}/resolve/main/planted.txt")
        assert (status, h["x-error-code"]) == (404, "EntryNotFound") and b"not for you" not in body
    finally:
        mp.stop()
