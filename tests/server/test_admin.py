"""Admin routes for the TUI, /health and the status event stream."""

from __future__ import annotations

import json
import os

import httpx


def test_load_pin_unload_cycle(client, stack):
    r = client.post("/admin/load", json={"model": "tiny", "keep_alive": "2m"})
    assert r.status_code == 200
    info = r.json()["loaded"]
    assert info["name"] == "tiny" and info["runtime"] == "fake" and 115 <= info["ttl_left_s"] <= 120
    assert client.post("/admin/pin", json={"model": "tiny"}).json()["loaded"]["pinned"] is True
    assert stack.manager.loaded()[0]["pinned"] is True and stack.manager.loaded()[0]["ttl_left_s"] is None
    assert client.post("/admin/pin", json={"model": "tiny", "pinned": False}).json()["loaded"]["pinned"] is False
    status = client.get("/admin/status").json()
    assert status["store"] == ["tiny"] and [m["name"] for m in status["models"]] == ["tiny"]
    assert status["pid"] == os.getpid() and status["worker_restarts"] == 0 and status["in_flight"] == 0
    assert client.post("/admin/unload", json={"model": "tiny"}).json() == {"model": "tiny", "unloaded": True}
    assert stack.manager.loaded() == []
    assert client.post("/admin/unload", json={"model": "tiny"}).json()["unloaded"] is False


def test_admin_errors(client):
    assert client.post("/admin/load", json={"model": "ghost"}).status_code == 404
    r = client.post("/admin/load", json={"model": "tiny", "keep_alive": "later"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive"
    r = client.post("/admin/load", json={"model": "tiny", "path": "/etc/passwd"})
    assert r.status_code == 400 and "path" in r.json()["error"]["message"]
    assert client.post("/admin/unload", json={"model": "ghost"}).status_code == 404


def test_health_lists_loaded_models(client):
    assert client.get("/health").json()["models"] == []
    client.post("/admin/load", json={"model": "tiny"})
    h = client.get("/health").json()
    assert h["status"] == "ok" and h["models"][0]["name"] == "tiny" and h["models"][0]["in_flight"] == 0
    assert client.get("/").headers["content-type"].startswith("text/html")  # the web app (tests/web)


def test_events_report_changes(live):
    with httpx.stream("GET", f"{live.url}/admin/events", timeout=10) as r:
        lines = r.iter_lines()

        def next_status() -> dict:
            for line in lines:
                if line.startswith("data: "):
                    return json.loads(line[6:])
            raise AssertionError("stream ended")

        assert next_status()["models"] == []
        httpx.post(f"{live.url}/admin/load", json={"model": "tiny"}, timeout=10).raise_for_status()
        assert [m["name"] for m in next_status()["models"]] == ["tiny"]
        httpx.post(f"{live.url}/admin/unload", json={"model": "tiny"}, timeout=10).raise_for_status()
        assert next_status()["models"] == []
