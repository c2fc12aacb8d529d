"""Pull and import describe a model through one door (``ModelStore.inspect_path``).

A pulled model and the same files imported by path must plan alike: the same metadata keys
(less the pull's own ``hub`` provenance) and the same KV estimate. Before the door was shared,
a pulled MLX repo kept 3 keys of its config.json where an import keeps 14, so it planned
with no KV estimate at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localrun.modelstore.hub import hf_home, hub_cache_dir, hub_cache_dirs, shared_hf_home
from localrun.modelstore.pull import pull
from localrun.planning.planner import plan_placement
from localrun.types import Format
from tests.hardware.helpers import profile, statuses
from tests.hub import repos

#: A config with the shape a planner needs (the standard fixture's is too thin to plan from).
SHAPED = {
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 4,
    "max_position_embeddings": 4096,
    "vocab_size": 256,
    "intermediate_size": 32,
}

PROVENANCE = {"hub", "mtimes"}  # where a pull came from; an import's per-file mtimes (a pull's are per entry)


def test_pulled_mlx_plans_like_the_same_folder_imported(fake_hub, store):
    fake_hub.add_repo("mlx-community/Shaped-4bit", repos.mlx_repo_files(config_extra=SHAPED))
    pulled = pull(store, "mlx-community/Shaped-4bit")
    imported = store.inspect_path(Path(pulled.path), name="shaped-by-path")
    assert set(pulled.metadata) - PROVENANCE == set(imported.metadata) - PROVENANCE
    assert pulled.metadata["head_count_kv"] == 2 and pulled.metadata["block_count"] == 1

    hw, st = profile("m2_mac_16gb"), statuses("metal", mlx="metal")
    by_pull, by_path = plan_placement(pulled, hw, st), plan_placement(imported, hw, st)
    assert by_pull.runtime == by_path.runtime == "mlx"
    assert by_pull.memory.kv_cache == by_path.memory.kv_cache > 0
    assert (by_pull.n_ctx, by_pull.memory.total) == (by_path.n_ctx, by_path.memory.total)


def test_pulled_gguf_is_described_like_the_same_file_imported(fake_hub, store):
    pulled = pull(store, repos.SPLIT_REPO + ":Q8_0")
    imported = store.inspect_path(Path(pulled.path), name="split-by-path")
    assert pulled.format is imported.format is Format.GGUF
    assert set(pulled.metadata) - PROVENANCE == set(imported.metadata) - PROVENANCE
    same = ("n_params", "size_bytes", "tensor_count", "shards", "architecture", "block_count")
    assert {k: pulled.metadata[k] for k in same} == {k: imported.metadata[k] for k in same}


HF_VARS = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HF_TOKEN_PATH")


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"XDG_CACHE_HOME": "{tmp}/xdg"},
        {"XDG_CACHE_HOME": "{tmp}/xdg", "HF_HOME": "{tmp}/hf"},
        {"HF_HOME": "{tmp}/hf", "HUGGINGFACE_HUB_CACHE": "{tmp}/old"},
        {"HF_HOME": "{tmp}/hf", "HUGGINGFACE_HUB_CACHE": "{tmp}/old", "HF_HUB_CACHE": "{tmp}/new"},
    ],
)
def test_one_hf_cache_locator_agrees_with_huggingface_hub(env, tmp_path, monkeypatch):
    """Where pull writes, rm deletes, discovery scans and the mirror serves is where huggingface_hub
    itself looks, unless LOCALRUN_HOME is set without HF_HOME: then localrun writes under LOCALRUN_HOME
    (it holds everything) and discovery reads huggingface_hub's cache as well."""
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    for var in HF_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code = "from huggingface_hub import constants as c; print(c.HF_HUB_CACHE); print(c.HF_TOKEN_PATH)"
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert [str(hub_cache_dirs()[-1]), str(shared_hf_home() / "token")] == theirs
    home = Path(os.environ["LOCALRUN_HOME"])  # the suite's
    moved = "HF_HOME" not in env and "HF_HUB_CACHE" not in env and "HUGGINGFACE_HUB_CACHE" not in env
    assert hub_cache_dir() == (home / "huggingface" / "hub" if moved else Path(theirs[0]))
    assert hub_cache_dirs() == ([hub_cache_dir(), Path(theirs[0])] if moved else [Path(theirs[0])])
    monkeypatch.delenv("LOCALRUN_HOME")
    assert [str(hub_cache_dir()), str(hf_home() / "token")] == theirs
