"""A model removed from the store while it is loaded can still be unloaded by its name, and a
DELETE /api/delete during a stream ends that stream cleanly (no unhandled exception in the log).

Before: every unload route resolved the name through the store first, so after ``localrun rm``
(another process) the loaded worker answered 404 to /admin/unload and to Ollama's keep_alive 0,
and held its memory until the server stopped."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.support import servers
from tests.support.launch import launch_env


@pytest.fixture
def server(tmp_path, tiny_gguf):
    home = tmp_path / "home"
    home.mkdir()
    servers.import_model(home, tiny_gguf, "tiny")
    servers.import_model(home, tiny_gguf, "other")
    spec = servers.launcher(servers.free_port(), home=home, options={"fake_delay_s": 0.05})
    proc = servers.start(spec, home / "server.log")
    proc.home = home
    yield proc
    proc.stop()


def _rm_elsewhere(home, name: str) -> None:
    """``localrun rm NAME`` as a person runs it in another terminal."""
    subprocess.run(
        [sys.executable, "-m", "localrun", "rm", name], env=launch_env(home), check=True, capture_output=True
    )


def _loaded(url: str) -> list[str]:
    return [m["name"] for m in httpx.get(f"{url}/api/ps", timeout=30).json()["models"]]


def test_a_model_removed_from_the_store_can_still_be_unloaded(server):
    for name, how in (("tiny", "admin"), ("other", "keep_alive")):
        httpx.post(f"{server.url}/admin/load", json={"model": name}, timeout=60).raise_for_status()
        _rm_elsewhere(server.home, name)
        assert any(n.startswith(name) for n in _loaded(server.url))
        if how == "admin":
            r = httpx.post(f"{server.url}/admin/unload", json={"model": name}, timeout=60)
            assert r.status_code == 200 and r.json()["unloaded"] is True, r.text
        else:
            r = httpx.post(f"{server.url}/api/generate", json={"model": name, "keep_alive": 0}, timeout=60)
            assert r.status_code == 200 and r.json()["done_reason"] == "unload", r.text
        assert not any(n.startswith(name) for n in _loaded(server.url))


def test_delete_during_a_stream_ends_it_without_an_unhandled_exception(server):
    got: list[str] = []

    def stream() -> None:
        body = {"model": "tiny", "prompt": "tell me a long story", "options": {"num_predict": 400}}
        try:
            with httpx.stream("POST", f"{server.url}/api/generate", json=body, timeout=60) as resp:
                for line in resp.iter_lines():
                    got.append(line)
        except httpx.HTTPError as exc:  # the stream may be cut: what matters is the server's side
            got.append(f"cut: {exc}")

    thread = threading.Thread(target=stream)
    thread.start()
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    r = httpx.request("DELETE", f"{server.url}/api/delete", json={"model": "tiny"}, timeout=60)
    assert r.status_code == 200, r.text
    thread.join(60)
    time.sleep(0.5)
    log = server.log_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
