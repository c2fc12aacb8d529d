"""The disk tier through a real server process: a prefix answered before a SIGTERM is on disk
once the process has exited, and the next server on the same cache folder answers it from
there with the same greedy tokens; a kill -9 leaves nothing that loads wrong.

The tiny random llama GGUF (plain attention), one slot, ``exact_prefix`` (a cached prefix then
gives the bits a cold prefill gives, so answers compare exactly), host RAM off (the slot goes
straight to disk at unload).
"""

from __future__ import annotations

import signal

import httpx
import pytest

from tests.conftest import needs_llama
from tests.support import servers

pytestmark = [needs_llama, pytest.mark.llama]

LONG = "hello the world is big and the time is now " * 12
PLAN = {"n_slots": 1, "slot_ctx": 512, "exact_prefix": True, "kv_ram_bytes": 0}


def _start(home):
    spec = servers.llama_tiny(servers.free_port(), home=home, plan=None, **PLAN)
    spec.env["LOCALRUN_RUNTIME__THREADS"] = "1"
    return servers.start(spec, home / "server.log")


def _complete(server, prompt: str, model: str = "tiny") -> tuple[str, int]:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    cached = (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return out["choices"][0]["text"], cached


@pytest.fixture
def home(tmp_path, tiny_gguf):
    servers.import_model(tmp_path, tiny_gguf, "tiny")
    return tmp_path


def test_a_prefix_survives_a_restart(home):
    first = _start(home)
    try:
        cold, cached = _complete(first, LONG + "one")
        assert cached == 0
    finally:
        first.stop()  # SIGTERM: the worker writes its slot before the server exits
    files = list(home.rglob("*.kv"))
    assert files, "nothing on disk once the server had exited"
    second = _start(home)
    try:
        again, cached = _complete(second, LONG + "one")
        metrics = httpx.get(f"{second.url}/metrics", timeout=30).text
    finally:
        second.stop()
    assert cached > 0 and again == cold
    assert "localrun_prompt_cache_disk_hits_total" in metrics


def test_kill_9_leaves_nothing_that_loads_wrong(home):
    first = _start(home)
    try:
        cold, _ = _complete(first, LONG + "one")
    finally:
        first.stop()
    # Corrupt what is there, then kill a server mid-life: the next one must answer right.
    for f in home.rglob("*.kv"):
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    killed = _start(home)
    _complete(killed, LONG + "two")
    killed.proc.send_signal(signal.SIGKILL)
    killed.proc.wait(30)
    last = _start(home)
    try:
        again, _ = _complete(last, LONG + "one")
    finally:
        last.stop()
    assert again == cold


def test_a_prefix_survives_a_keep_alive_unload(home):
    """The model unloads after its keep-alive (the worker writes its slot as it goes), and the
    reload answers the same prompt from disk with the cold tokens."""
    spec = servers.llama_tiny(servers.free_port(), home=home, plan=None, **PLAN)
    spec.env.update(LOCALRUN_RUNTIME__THREADS="1", LOCALRUN_RUNTIME__KEEP_ALIVE_S="1")
    server = servers.start(spec, home / "server.log")
    try:
        cold, _ = _complete(server, LONG + "one")

        def unloaded() -> bool:
            return not httpx.get(f"{server.url}/api/ps", timeout=10).json().get("models")

        assert servers.wait_until(unloaded, timeout=60, interval=0.2), "the model never unloaded"
        assert servers.wait_until(lambda: list(home.rglob("*.kv")), timeout=30, interval=0.2)
        again, cached = _complete(server, LONG + "one")
    finally:
        server.stop()
    assert cached > 0 and again == cold


def test_a_prefix_survives_a_swap_to_another_model_and_back(home, tiny_gguf):
    """One model fits (max_loaded_models 1): asking for another unloads the first, which writes
    its slot; asking for the first again reloads it and answers from disk."""
    other = home / "other.gguf"
    other.write_bytes(tiny_gguf.read_bytes())  # another file (path, mtime): its own key
    servers.import_model(home, other, "other")
    spec = servers.llama_tiny(servers.free_port(), home=home, plan=None, **PLAN)
    spec.env.update(LOCALRUN_RUNTIME__THREADS="1", LOCALRUN_RUNTIME__MAX_LOADED_MODELS="1")
    server = servers.start(spec, home / "server.log")
    try:
        cold, _ = _complete(server, LONG + "one")
        _complete(server, LONG + "two", model="other")
        ps = httpx.get(f"{server.url}/api/ps", timeout=10).json()["models"]
        loaded = [m.get("name") or m.get("model") for m in ps]
        assert loaded and all(str(n).startswith("other") for n in loaded), loaded
        again, cached = _complete(server, LONG + "one")
    finally:
        server.stop()
    assert cached > 0 and again == cold
