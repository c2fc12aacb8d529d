"""Ollama's blob uploads and ``/api/create`` from ``files``, through the official ``ollama`` client
(its documented way to make a model from a GGUF: ``create_blob`` then ``create(files=…)``), and
the browser rule for pages CORS already trusts."""

from __future__ import annotations

import hashlib
import shutil

import httpx
import ollama
import pytest

from tests.factories import write_tiny_llama_gguf


@pytest.fixture
def small_body_live(build_stack, live_factory):
    """A live server whose body limit (4 KiB) is far below the GGUF uploaded: uploads stream past it."""
    return live_factory(build_stack(max_body_bytes=4096))


def _blobs(live) -> list[str]:
    root = live.stack.settings.data_dir / "blobs"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_create_blob_then_create_from_files_with_the_official_client(small_body_live, tmp_path):
    live = small_body_live
    oll = ollama.Client(host=live.url, timeout=30)
    gguf = write_tiny_llama_gguf(tmp_path / "mine.gguf", seed=7)
    assert gguf.stat().st_size > 4096 * 10
    digest = oll.create_blob(gguf)
    assert _blobs(live) == [digest.replace(":", "-")]
    assert httpx.head(f"{live.url}/api/blobs/{digest}").status_code == 200
    done = list(oll.create(model="uploaded", files={"mine.gguf": digest}, stream=True))
    assert done[-1].status == "success"
    assert "uploaded:latest" in {m.model for m in oll.list().models}
    answer = oll.chat(model="uploaded", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
    assert answer.message.content is not None
    record = live.stack.store.index.get("uploaded")
    assert record.owned, record
    assert record.files[0].sha256 == digest.split(":")[1]
    oll.delete("uploaded")
    assert _blobs(live) == []  # an upload is localrun's: deleted with the last model that uses it


def test_an_upload_whose_bytes_are_not_its_digest_is_refused_and_leaves_nothing(small_body_live, tmp_path):
    live = small_body_live
    wrong = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    r = httpx.post(f"{live.url}/api/blobs/{wrong}", content=b"x" * 20_000, timeout=30)
    assert r.status_code == 409 and "sha256" in r.json()["error"]
    assert _blobs(live) == []
    bad = httpx.post(f"{live.url}/api/blobs/sha256:nothex", content=b"x", timeout=30)
    assert bad.status_code == 400 and "digest" in bad.json()["error"]
    missing = "sha256:" + "2" * 64
    r = httpx.post(f"{live.url}/api/create", json={"model": "m", "files": {"m.gguf": missing}, "stream": False})
    assert r.status_code == 400 and "upload" in r.json()["error"]


def test_head_finds_an_imported_file_whose_sha256_was_never_recorded(stack, client, tmp_path):
    """Ollama's CLI asks HEAD before it uploads: an imported file answers 200 without `verify` first."""
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(stack.store.index.get("tiny").path, copy)
    stack.store.import_path(copy, name="copied")
    assert stack.store.index.get("copied").files[0].sha256 is None
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    assert client.head(f"/api/blobs/sha256:{digest}").status_code == 200
    assert stack.store.index.get("copied").files[0].sha256 == digest  # learned once, kept
    r = client.post("/api/create", json={"model": "again", "files": {"c.gguf": f"sha256:{digest}"}, "stream": False})
    assert r.status_code == 200, r.text
    assert stack.store.index.get("again").path == str(copy)
    assert not stack.store.index.get("again").owned  # the imported file stays its owner's


def test_a_trusted_page_may_post_text_plain_as_ollama_allows(client, stack):
    """A page on localhost that fetch()es /api/chat with a string body sends text/plain (no preflight):
    its origin is one CORS already trusts, so the body is read as JSON; other origins stay 415."""
    body = '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": false}'
    for origin in ("http://localhost:3000", "http://127.0.0.1:8080", "chrome-extension://abc", "http://localhost"):
        r = client.post("/api/chat", content=body, headers={"origin": origin, "content-type": "text/plain"})
        assert r.status_code == 200, (origin, r.text)
    same = client.post("/api/chat", content=body, headers={"sec-fetch-site": "same-origin"})
    assert same.status_code == 200
    for origin in ("https://evil.example", "null", "http://localhost.evil.example"):
        r = client.post("/api/chat", content=body, headers={"origin": origin, "content-type": "text/plain"})
        assert r.status_code == 415, origin
