"""The prompt cache made visible, through a real server on real llama.cpp (the tiny GGUF):
``/metrics`` gauges what each tier holds and counts the disk tier's traffic, labelled by model;
``/api/ps`` carries the numbers under ``localrun.cache`` and ``localrun ps`` shows them; none of
these reads loads a model or keeps one alive. (Disk numbers stay 0 until the disk tier lands:
what is asserted is what this code computes from the slots and host RAM.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import needs_llama
from tests.support.launch import REPO, launch_env

pytestmark = [needs_llama, pytest.mark.llama]

PROMPT = "hello the time is now and the world is big " * 3


@pytest.fixture(scope="module")
def server(serve_module, tiny_gguf):
    return serve_module(tiny_gguf, plan={"n_threads": 1}, n_slots=2, slot_ctx=256)


def metric(text: str, name: str, **labels) -> int:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{name}{{{re.escape(want)}}} (\d+)$", text, re.M)
    assert found, f"{name}{{{want}}} not in /metrics"
    return int(found.group(1))


def held_tokens(server) -> int:
    return sum(s["n_prompt_tokens"] for s in httpx.get(server.url + "/slots", timeout=60).json())


def test_metrics_and_ps_show_what_the_cache_holds(server):
    r = httpx.post(server.url + "/completion", json={"prompt": PROMPT, "n_predict": 4, "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    held = held_tokens(server)
    assert held > 0
    text = httpx.get(server.url + "/metrics", timeout=60).text
    assert metric(text, "localrun_prompt_cache_tokens", model="tiny", tier="slots") == held
    assert metric(text, "localrun_prompt_cache_tokens", model="tiny", tier="ram") == 0  # host tier off by default
    assert metric(text, "localrun_prompt_cache_bytes", model="tiny", tier="disk") >= 0
    for name in ("hits", "misses", "read_bytes", "written_bytes"):
        assert metric(text, f"localrun_prompt_cache_disk_{name}_total", model="tiny") >= 0
    assert "# TYPE localrun_prompt_cache_disk_hits_total counter" in text

    ps = httpx.get(server.url + "/api/ps", timeout=60).json()["models"]
    cache = ps[0]["localrun"]["cache"]
    assert cache["slot_tokens"] == held and cache["slots"] == 2 and cache["slots_held"] == 1

    port = server.url.rsplit(":", 1)[1]
    env = launch_env(LOCALRUN_SERVER__PORT=port, COLUMNS="200")  # wide enough that no cell wraps
    cli = subprocess.run(
        [sys.executable, "-m", "localrun", "ps", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    rows = json.loads(cli.stdout)
    assert rows[0]["localrun"]["cache"]["slot_tokens"] == held
    table = subprocess.run(
        [sys.executable, "-m", "localrun", "ps"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60
    )
    assert table.returncode == 0 and f"1 · {held} tok" in table.stdout, table.stdout


def test_reading_the_cache_numbers_keeps_no_model_alive(server):
    httpx.post(server.url + "/completion", json={"prompt": "zebra", "n_predict": 1}, timeout=120)
    time.sleep(1.2)
    before = httpx.get(server.url + "/api/ps", timeout=60).json()["models"][0]["localrun"]["idle_s"]
    httpx.get(server.url + "/metrics", timeout=60)
    after = httpx.get(server.url + "/api/ps", timeout=60).json()["models"][0]["localrun"]["idle_s"]
    assert before >= 1.0 and after >= before  # a scrape is not a use: the keep-alive clock runs on
