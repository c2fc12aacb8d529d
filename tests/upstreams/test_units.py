"""Fast tests of the upstream pieces without servers: config file writing, routing policy,
name rules, the vLLM placement and plan, and the ``localrun upstream`` commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from localrun.runtimes.base import RuntimeStatus
from localrun.settings import UpstreamConfig, UpstreamSettings
from localrun.types import Format, ModelRecord
from localrun.upstreams.config_file import read_upstreams, write_upstreams
from localrun.upstreams.pool import Route, UpstreamPool, affinity_key
from localrun.upstreams.routing import listed_models

GIB = 2**30


class _NoClient:
    """Stands in for the HTTP client where a test looks only at routing (no request is sent)."""

    def close(self) -> None:
        pass


def _pool(*names: str, routing: str = "least-loaded", weights=None, models=("m",)) -> UpstreamPool:
    ups = [
        UpstreamConfig(
            name=n, url=f"http://127.0.0.1:{9000 + i}", models=list(models), weight=(weights or {}).get(n, 1.0)
        )
        for i, n in enumerate(names)
    ]
    return UpstreamPool(
        ups,
        UpstreamSettings(routing=routing, affinity_prefix_chars=64),
        client_factory=lambda c: _NoClient(),
        start=False,
    )


def test_config_round_trip_keeps_the_rest_of_the_file(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '# my settings\n[server]\nport = 9001\n\n[[upstreams]]\nname = "old"\nurl = "http://h:1"\n\n[hub]\noffline = '
        "true\n"
    )
    write_upstreams(
        path,
        [
            UpstreamConfig(name="a", url="http://10.0.0.5:8000/v1/", kind="vllm", key_env="A_KEY", models=["x"]),
            UpstreamConfig(name="b", url="https://b.example:443", key="sk-b"),
        ],
    )
    text = path.read_text()
    assert "# my settings" in text and "port = 9001" in text and "offline = true" in text and '"old"' not in text
    ups = read_upstreams(path)
    assert [(u.name, u.url, u.kind) for u in ups] == [
        ("a", "http://10.0.0.5:8000", "vllm"),
        ("b", "https://b.example:443", "openai"),
    ]
    assert ups[0].api_key({"A_KEY": "from-env"}) == "from-env" and ups[1].api_key() == "sk-b"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    from localrun.settings import Settings

    assert [u.name for u in Settings(_env_file=None).upstreams] == []  # not this file: LOCALRUN_HOME's


@pytest.mark.parametrize(
    "fields,words",
    [
        ({"name": "a/b", "url": "http://h"}, "no '/'"),
        ({"name": "a", "url": "ftp://h"}, "http:// or https://"),
        ({"name": "a", "url": "http://h", "kind": "exllama"}, "try one of: vllm"),
        ({"name": "a", "url": "http://h", "key": "k", "key_env": "K"}, "either 'key' or 'key_env'"),
    ],
)
def test_bad_upstream_config_names_what_is_wrong(fields, words):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        UpstreamConfig(**fields)
    assert words in str(err.value)


def test_least_loaded_is_weighted_and_alternates_when_idle():
    pool = _pool("a", "b", weights={"a": 3.0})
    route = Route("m", "m", ("a", "b"), False)
    held = [pool.acquire(route, exclude=set(), key=None, wait_s=1) for _ in range(8)]
    counts = {n: sum(st.name == n for st in held) for n in ("a", "b")}
    assert counts == {"a": 6, "b": 2}  # in-flight / weight stays level
    for st in held:
        pool.release(st)
    order = []
    for _ in range(4):
        st = pool.acquire(route, exclude=set(), key=None, wait_s=1)
        order.append(st.name)
        pool.release(st)
    assert set(order) == {"a", "b"}


def test_prefix_affinity_sticks_until_the_sticky_upstream_is_much_busier():
    pool = _pool("a", "b", routing="prefix-affinity")
    route = Route("m", "m", ("a", "b"), False)
    key = affinity_key("s" * 100, 64)
    first = pool.acquire(route, exclude=set(), key=key, wait_s=1)
    again = [pool.acquire(route, exclude=set(), key=key, wait_s=1) for _ in range(8)]
    assert {st.name for st in again} == {first.name}  # 9 in flight vs 0: gap 9 > 8 not reached yet
    moved = pool.acquire(route, exclude=set(), key=key, wait_s=1)
    assert moved.name != first.name  # gap 9 > 8 and 9 > 1.5 x 0: least-loaded wins
    assert affinity_key("short", 64) is None


def test_full_upstreams_make_a_caller_wait_then_overloaded():
    from localrun.errors import Overloaded

    pool = UpstreamPool(
        [UpstreamConfig(name="a", url="http://h:1", models=["m"], max_concurrency=1)],
        UpstreamSettings(),
        client_factory=lambda c: _NoClient(),
        start=False,
    )
    route = Route("m", "m", ("a",), False)
    pool.acquire(route, exclude=set(), key=None, wait_s=1)
    with pytest.raises(Overloaded) as err:
        pool.acquire(route, exclude=set(), key=None, wait_s=0.2)
    assert "max_concurrency" in err.value.message and err.value.http_status == 503


def test_names_local_wins_and_upstream_copy_gets_a_prefix():
    pool = _pool("a", "b", models=("m", "only-up"))
    listed = {x.name: x for x in listed_models(pool, ["m", "local-only"])}
    assert set(listed) == {"a/m", "b/m", "only-up"}
    assert listed["only-up"].route.upstreams == ("a", "b") and listed["a/m"].route.pinned
    assert pool.route("b/m") == Route("b/m", "m", ("b",), True)
    assert pool.route("m").upstreams == ("a", "b") and pool.route("nope") is None


def test_vllm_placement_sizes_tensor_parallelism_and_context():
    from localrun.planning.policies.vllm import vllm_placement

    one = vllm_placement(16 * GIB, 128 * 1024, 8192, [24 * GIB])
    assert one["fits"] and one["tensor_parallel_size"] == 1 and one["max_model_len"] == 8192
    big = vllm_placement(120 * GIB, 320 * 1024, 8192, [80 * GIB] * 4)
    assert big["fits"] and big["tensor_parallel_size"] == 2
    shrunk = vllm_placement(16 * GIB, 1024 * 1024, 32768, [24 * GIB])
    assert shrunk["fits"] and shrunk["max_model_len"] < 32768
    assert not vllm_placement(400 * GIB, 0, 4096, [24 * GIB])["fits"]
    assert not vllm_placement(1, 0, 4096, [])["fits"]


def test_planner_picks_vllm_on_cuda_only_and_shows_its_options(monkeypatch):
    from localrun.planning.planner import PlanOverrides, plan_placement
    from localrun.planning.render import render_plan
    from tests.hardware.helpers import LLAMA_8B, profile, statuses

    monkeypatch.delenv("LOCALRUN_VLLM_DEVICE", raising=False)
    rec = ModelRecord(name="llama-hf", format=Format.MLX, path="/m/llama", metadata=dict(LLAMA_8B, quant=None))
    st = {**statuses("cuda"), "vllm": RuntimeStatus("vllm", True, devices=("cuda:0",))}
    plan = plan_placement(rec, profile("rtx4090_desktop"), st)
    assert plan.runtime == "vllm" and plan.device == "cuda" and plan.options["tensor_parallel_size"] == 1
    assert 0 < plan.options["gpu_memory_utilization"] <= 0.95 and plan.options["max_model_len"] == plan.n_ctx
    assert any(line.startswith("vllm      tensor parallel 1") for line in render_plan(plan, rec))
    off = {**st, "vllm": RuntimeStatus("vllm", False, reason="vLLM needs a CUDA GPU and none was found")}
    mlx = {**off, "mlx": RuntimeStatus("mlx", True, devices=("cpu",))}
    assert plan_placement(rec, profile("cpu_laptop_8gb"), mlx).runtime == "mlx"
    monkeypatch.setenv("LOCALRUN_VLLM_DEVICE", "cpu")
    asked = plan_placement(rec, profile("cpu_laptop_8gb"), st, overrides=PlanOverrides(runtime="vllm"))
    assert asked.runtime == "vllm" and asked.device == "cpu"


def test_vllm_command_line_follows_the_plan():
    from localrun.runtimes.vllm import build_vllm_command
    from localrun.types import Plan

    rec = ModelRecord(name="m", format=Format.MLX, path="/models/m")
    plan = Plan(
        runtime="vllm",
        device="cuda",
        n_ctx=4096,
        options={"tensor_parallel_size": 2, "max_model_len": 4096, "gpu_memory_utilization": 0.85},
    )
    cmd = build_vllm_command(rec, plan, 4321, python="/venv/bin/python")
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    assert (
        "--tensor-parallel-size 2" in joined
        and "--max-model-len 4096" in joined
        and "--gpu-memory-utilization 0.85" in joined
    )
    assert "--host 127.0.0.1 --port 4321" in joined and "trust-remote-code" not in joined


def _lr(*args, env=None):
    full = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "localrun", *args], capture_output=True, text=True, timeout=60, env=full
    )


def test_upstream_commands_add_ls_check_rm(tmp_path, fake_upstream):
    up = fake_upstream()
    env = {"LOCALRUN_HOME": str(tmp_path / "home")}
    r = _lr("upstream", "add", "box2", up.url, "--kind", "localrun", "--max-concurrency", "4", env=env)
    assert r.returncode == 0, r.stderr
    assert "box2 (localrun)" in r.stdout and "serves: tiny" in r.stdout
    rows = json.loads(_lr("upstream", "ls", "--json", env=env).stdout)
    assert rows == [
        {
            "name": "box2",
            "url": up.url,
            "kind": "localrun",
            "key": "none",
            "models": "discovered",
            "max_concurrency": 4,
            "weight": 1.0,
        }
    ]
    check = json.loads(_lr("upstream", "check", "--json", env=env).stdout)[0]
    assert check["ok"] and check["models"] == ["tiny"] and check["version"] and check["latency_ms"] >= 0
    listed = json.loads(_lr("ls", "--json", env=env).stdout)
    assert [(r["name"], r["format"], r["source"]) for r in listed] == [("tiny", "remote", "upstream box2 (up)")]
    assert _lr("upstream", "add", "box2", up.url, env=env).returncode != 0  # taken: needs --replace
    assert _lr("upstream", "rm", "box2", env=env).returncode == 0
    gone = _lr("upstream", "rm", "box2", env=env)
    assert gone.returncode != 0 and "no upstream named 'box2'" in gone.stderr
    down = _lr("upstream", "add", "dead", "http://127.0.0.1:9", "--kind", "vllm", "--key-env", "NOPE_KEY", env=env)
    assert "Connection refused" in down.stdout and "NOPE_KEY is not set" in down.stdout
    assert _lr("upstream", "check", "dead", env=env).returncode == 11


@pytest.mark.parametrize(
    "usage, want",
    [
        (
            {
                "prompt_tokens": 5,
                "completion_tokens": 9,
                "prompt_tokens_details": {"cached_tokens": 4},
                "speculative": {"drafted_tokens": 12, "accepted_tokens": 7},
            },
            (5, 9, 4, 12, 7),
        ),
        (
            {
                "prompt_tokens": 5,
                "completion_tokens": 9,  # OpenAI's prediction fields, no extension
                "completion_tokens_details": {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 2},
            },
            (5, 9, 0, 5, 3),
        ),
        (
            {
                "prompt_tokens": "5",
                "completion_tokens": -3,
                "prompt_tokens_details": "x",  # hostile: never an error
                "speculative": {"drafted_tokens": 2, "accepted_tokens": 1e9},
            },
            (0, 0, 0, 2, 2),
        ),
        (
            {
                "prompt_tokens": True,
                "completion_tokens": float("nan"),
                "completion_tokens_details": None,
                "speculative": {"drafted_tokens": float("inf")},
            },
            (0, 0, 0, 0, 0),
        ),
    ],
)
def test_upstream_usage_keeps_drafting_counts_and_survives_odd_values(usage, want):
    from localrun.runtimes.openai_compat.client import _usage

    u = _usage(usage)
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.drafted_tokens, u.accepted_tokens) == want


def test_manager_catalog_lists_local_then_upstream_models_with_labels_and_status():
    """Every front end reads this one listing: a local name keeps its bare name, the upstream copy gets a prefix."""
    from localrun.manager import ModelManager
    from localrun.settings import load_settings
    from tests.core.test_manager import DictStore

    pool = _pool("a", "b", models=("m", "only-up"))
    manager = ModelManager(load_settings(), DictStore("m"), upstreams=pool)
    try:
        entries = {e.name: e for e in manager.catalog()}
        assert list(entries) == ["m", "a/m", "b/m", "only-up"]
        assert entries["m"].upstreams == () and entries["m"].health is None
        assert entries["only-up"].upstreams == ("a", "b") and entries["only-up"].upstream_model == "only-up"
        assert entries["a/m"].source == "upstream a (unknown)" and entries["a/m"].health == "unknown"
        assert [s["name"] for s in manager.upstream_status()] == ["a", "b"]
        assert manager.observe_upstreams(lambda *a, **k: None) and len(pool.observers) == 1
    finally:
        manager.shutdown()


def test_manager_without_upstreams_has_an_empty_status_and_a_local_catalog():
    from localrun.manager import ModelManager
    from localrun.settings import load_settings
    from tests.core.test_manager import DictStore

    manager = ModelManager(load_settings(), DictStore("x"))
    try:
        assert manager.upstream_status() == [] and not manager.observe_upstreams(lambda *a, **k: None)
        assert [(e.name, e.source, e.upstreams) for e in manager.catalog()] == [("x", "imported", ())]
    finally:
        manager.shutdown()


def test_an_upstream_name_routes_to_a_loaded_model_the_manager_builds_itself():
    """Routing hands back an entry; the manager wraps it (pinned, never reaped) and reuses it."""
    from localrun.manager import ModelManager
    from localrun.residency import LoadedModel
    from localrun.settings import load_settings
    from tests.core.test_manager import DictStore

    pool = _pool("a", models=("only-up",))
    manager = ModelManager(load_settings(), DictStore(), upstreams=pool)
    try:
        lm = manager.load("only-up")
        assert isinstance(lm, LoadedModel) and lm.pinned and lm.plan.runtime == "upstream"
        assert manager.load("only-up") is lm and manager.resolve("only-up").metadata["upstreams"] == ["a"]
    finally:
        manager.shutdown()
