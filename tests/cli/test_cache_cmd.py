"""``localrun cache ls`` and ``localrun cache clear [MODEL]`` as a person runs them (real
subprocesses) on a cache folder populated by the disk tier itself: no model, no llama.cpp."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localrun.runtimes.llamacpp.cache.kv_disk import DiskTier
from tests.batching.kv_disk_child import blob_for, key
from tests.cli.test_cli_e2e import lr


def populate(root: Path) -> dict[str, DiskTier]:
    tiers = {name: DiskTier(root, key(name), budget_bytes=1 << 30) for name in ("alpha", "beta")}
    for n, tokens in enumerate([range(100), range(300), range(50)]):
        t = tiers["alpha" if n < 2 else "beta"]
        assert t.put(tuple(tokens), blob_for(tuple(tokens), 4000 * (n + 1)))
    tiers["beta"].put(tuple(range(40)), b"checkpoint state", kind="checkpoint")
    for t in tiers.values():
        t.close()
    return tiers


@pytest.fixture
def kv_dir(_isolated_home) -> Path:
    return _isolated_home / "cache" / "kv"  # the default: <cache_dir>/kv under LOCALRUN_HOME


def test_ls_lists_each_model_and_clear_model_removes_only_its_files(kv_dir):
    tiers = populate(kv_dir)
    rows = {r["model"]: r for r in json.loads(lr("cache", "ls", "--json").stdout)}
    assert set(rows) == {"alpha", "beta"}
    alpha = rows["alpha"]
    assert alpha["digest"] == tiers["alpha"].key.digest() and alpha["model_sha256"] == tiers["alpha"].key.model_sha256
    assert (alpha["entries"], alpha["tokens"], alpha["checkpoints"]) == (2, 400, 0)
    assert alpha["bytes"] == sum(p.stat().st_size for p in tiers["alpha"].folder.glob("*.kv"))
    assert (rows["beta"]["entries"], rows["beta"]["checkpoints"], rows["beta"]["tokens"]) == (2, 1, 90)
    table = lr("cache", "ls").stdout
    assert "alpha" in table and "beta" in table and alpha["digest"][:12] in table

    out = lr("cache", "clear", "alpha")
    assert f"removed 2 files of alpha ({_human(alpha['bytes'])})" in out.stdout
    assert [r["model"] for r in json.loads(lr("cache", "ls", "--json").stdout)] == ["beta"]
    nothing = lr("cache", "clear", "gamma")
    assert "nothing cached for 'gamma' (cached: beta)" in nothing.stderr and nothing.returncode == 0

    everything = lr("cache", "clear")
    assert "removed 2 files" in everything.stdout and str(kv_dir) in everything.stdout
    assert json.loads(lr("cache", "ls", "--json").stdout) == []
    assert "no cached prefixes" in lr("cache", "ls").stderr
    assert "nothing cached" in lr("cache", "clear").stderr


def test_the_commands_use_the_configured_kv_dir(tmp_path, monkeypatch, kv_dir):
    elsewhere = tmp_path / "my-kv"
    populate(elsewhere)
    monkeypatch.setenv("LOCALRUN_CACHE__KV_DIR", str(elsewhere))
    assert len(json.loads(lr("cache", "ls", "--json").stdout)) == 2
    digest = key("beta").digest()
    assert "removed 2 files of " + digest[:8] in lr("cache", "clear", digest[:8]).stdout
    assert not kv_dir.exists() and os.listdir(elsewhere) != []


def _human(n: int) -> str:
    from localrun.cli.output import human_bytes

    return human_bytes(n)
