"""One process, both APIs: ``localrun serve --mirror`` answers OpenAI /v1, Ollama /api and
the hub routes on one port (the TUI's side: tests/tui/test_server_mirror.py)."""

from __future__ import annotations

import hashlib
import signal

import httpx
import pytest

from tests.hub import repos
from tests.mirror.hosts import start_serve
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(180)


def test_serve_mirror_serves_models_and_the_hub_on_one_port(filled_home, tmp_path):
    from huggingface_hub import hf_hub_download

    port = free_port()
    proc, seen = start_serve(filled_home, port, "--mirror", "--runtime", "fake", until="HF_ENDPOINT=")
    url = f"http://127.0.0.1:{port}"
    try:
        assert f"HF_ENDPOINT={url}" in seen, seen[-2000:]
        models = httpx.get(f"{url}/v1/models").json()["data"]
        assert any(m["id"] == "tiny-llama" for m in models)
        path = hf_hub_download(repos.GGUF_REPO, "Tiny-Q4_K_M.gguf", endpoint=url, cache_dir=tmp_path / "c", token=False)
        assert (
            hashlib.sha256(open(path, "rb").read()).hexdigest()
            == hashlib.sha256(repos.gguf_repo_files()["Tiny-Q4_K_M.gguf"]).hexdigest()
        )
        assert httpx.get(f"{url}/api/models/nobody/nothing").headers["x-error-code"] == "RepoNotFound"
        assert httpx.get(f"{url}/api/tags").status_code == 200  # the Ollama API is still there
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
