"""``localrun mirror --upstream``: what host A's store lacks comes from the upstream hub
through localrun's verified downloader, is kept in A's HF cache, and is served — once per
file however many clients ask at the same time, and still when the upstream is gone."""

from __future__ import annotations

import concurrent.futures
import hashlib

import httpx
import pytest

from tests.hub import repos
from tests.hub.fakehub import FakeHub
from tests.hub.repos import populate
from tests.mirror.hosts import start_mirror

pytestmark = pytest.mark.timeout(180)


def _resolve_gets(hub: FakeHub, name: str) -> int:
    return sum(1 for r in hub.requests if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(name))


def test_pull_through_fetches_once_keeps_and_serves(tmp_path):
    hub = populate(FakeHub()).start()
    home, upstream = tmp_path / "edge", hub.url
    mp = start_mirror(home, upstream=upstream)
    try:
        files = repos.gguf_repo_files()
        url = f"{mp.url}/{repos.GGUF_REPO}/resolve/main/Tiny-Q8_0.gguf"
        head = httpx.head(url)  # answered from the upstream's listing, without a download
        assert (
            head.status_code == 200
            and head.headers["etag"] == f'"{hashlib.sha256(files["Tiny-Q8_0.gguf"]).hexdigest()}"'
        )
        assert _resolve_gets(hub, "Tiny-Q8_0.gguf") == 0
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            bodies = list(pool.map(lambda _: httpx.get(url, timeout=60).content, range(8)))
        assert bodies == [files["Tiny-Q8_0.gguf"]] * 8
        assert _resolve_gets(hub, "Tiny-Q8_0.gguf") == 1  # eight clients, one download
        blob = (
            home
            / "hf"
            / "hub"
            / "models--testorg--Tiny-GGUF"
            / "blobs"
            / hashlib.sha256(files["Tiny-Q8_0.gguf"]).hexdigest()
        )
        assert blob.read_bytes() == files["Tiny-Q8_0.gguf"]
        info = httpx.get(f"{mp.url}/api/models/{repos.GGUF_REPO}").json()
        assert set(info["siblings"][i]["rfilename"] for i in range(len(info["siblings"]))) == set(files)
        found = [m["id"] for m in httpx.get(f"{mp.url}/api/models", params={"search": "tiny"}).json()]
        assert repos.GGUF_REPO in found and repos.MLX_REPO in found  # the upstream's repos, through the edge
        missing = httpx.get(f"{mp.url}/nobody/none/resolve/main/x.gguf")
        assert missing.status_code == 404 and missing.headers["x-error-code"] == "RepoNotFound"
    finally:
        mp.stop()
        hub.stop()
    # the upstream is gone: what was fetched is still served from the cache, by revision
    mp = start_mirror(home, upstream=upstream)
    try:
        got = httpx.get(f"{mp.url}/{repos.GGUF_REPO}/resolve/main/Tiny-Q8_0.gguf", timeout=60)
        assert got.status_code == 200 and got.content == files["Tiny-Q8_0.gguf"]
        assert "unreachable" in mp.log_text() and got.headers["x-hf-warning"].startswith("localrun-mirror; upstream")
    finally:
        mp.stop()


def test_pull_through_refuses_a_tampering_upstream(tmp_path):
    """The upstream lists one sha256 and sends other bytes: nothing is kept, and the client
    never gets a whole body (a first GET streams while fetching, so it is cut short; the
    next one is refused outright)."""
    hub = populate(FakeHub()).start()
    edge = tmp_path / "edge"
    mp = start_mirror(edge, upstream=hub.url)
    try:
        assert (
            httpx.get(f"{mp.url}/api/models/{repos.GGUF_REPO}/tree/main").status_code == 200
        )  # listed (and hashed) first
        for files in hub.repos[repos.GGUF_REPO].commits.values():  # FakeFile keeps the hashes it listed
            f = files["Tiny-Q5_K_M.gguf"]
            f.data = bytes([f.data[0] ^ 1]) + f.data[1:]
        url = f"{mp.url}/{repos.GGUF_REPO}/resolve/main/Tiny-Q5_K_M.gguf"
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(url, timeout=60)
        got = httpx.get(url, headers={"Range": "bytes=0-"}, timeout=60)  # a Range waits for the fetch: its error shows
        assert got.status_code == 502 and "do not match" in got.json()["error"]
        blobs = edge / "hf" / "hub" / "models--testorg--Tiny-GGUF" / "blobs"
        assert not [p for p in blobs.iterdir()] if blobs.is_dir() else True
    finally:
        mp.stop()
        hub.stop()


def test_pull_through_streams_while_it_fetches(tmp_path):
    """A big file reaches the client as it arrives from the upstream (no read timeout while
    the edge downloads), its last block only after the edge verified the whole."""
    hub = populate(FakeHub()).start()
    data = repos.make_gguf(payload=3 << 20, seed=33)
    hub.add_repo("slow/Big-GGUF", {"Big-Q4_K_M.gguf": data}, tags=("gguf",))
    hub.faults.throttle_bps = 1_500_000
    edge = tmp_path / "edge"
    blob = edge / "hf" / "hub" / "models--slow--Big-GGUF" / "blobs" / hashlib.sha256(data).hexdigest()
    mp = start_mirror(edge, upstream=hub.url)
    try:
        got, early = bytearray(), None
        with httpx.stream("GET", f"{mp.url}/slow/Big-GGUF/resolve/main/Big-Q4_K_M.gguf", timeout=60) as resp:
            assert resp.status_code == 200 and int(resp.headers["content-length"]) == len(data)
            for chunk in resp.iter_raw():
                if early is None:
                    early = blob.exists()  # the first bytes came while the edge was still downloading
                got += chunk
        assert early is False and bytes(got) == data and blob.read_bytes() == data
        assert _resolve_gets(hub, "Big-Q4_K_M.gguf") == 1
    finally:
        mp.stop()
        hub.stop()
