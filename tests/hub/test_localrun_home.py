"""LOCALRUN_HOME holds everything when HF_HOME is not set: pulls land under it, nothing is written
to ~/.cache; discovery still reads huggingface_hub's shared cache; rm leaves no empty folders (issue 33)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localrun.modelstore.hub import hub_cache_dir
from localrun.modelstore.pull import pull
from localrun.modelstore.sources.hf_cache import discover_hf_cache
from tests.hub import repos


@pytest.fixture
def no_hf_home(monkeypatch, tmp_path):
    """The suite sets HF_HOME; a newcomer with only LOCALRUN_HOME does not. HOME is a fresh folder."""
    for var in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return Path(os.environ["LOCALRUN_HOME"])


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() or p.is_symlink()] if root.exists() else []


def test_pull_lands_under_localrun_home_and_rm_leaves_nothing(fake_hub, store, no_hf_home, tmp_path):
    assert hub_cache_dir() == no_hf_home / "huggingface" / "hub"
    q4 = pull(store, repos.GGUF_REPO)
    q8 = pull(store, repos.GGUF_REPO + ":Q8_0")
    repo_dir = hub_cache_dir() / "models--testorg--Tiny-GGUF"
    assert Path(q4.path).is_relative_to(no_hf_home) and repo_dir.is_dir()
    assert _files(tmp_path / "user") == [], "nothing written outside LOCALRUN_HOME"
    store.remove(q4.name)
    assert repo_dir.is_dir() and Path(q8.path).exists(), "the other quant keeps the repo"
    store.remove(q8.name)
    assert not repo_dir.exists(), f"rm left {[str(p) for p in repo_dir.rglob('*')]}"


def test_discovery_still_reads_the_shared_hf_cache(fake_hub, store, no_hf_home, tmp_path, monkeypatch):
    shared = tmp_path / "user" / ".cache" / "huggingface"
    monkeypatch.setenv("HF_HOME", str(shared))
    pull(store, repos.GGUF_REPO)  # what `hf download` put in the shared cache
    store.remove("testorg/tiny-gguf:q4_k_m")  # owned: deleted
    pull(store, repos.GGUF_REPO)
    store.index.remove("testorg/tiny-gguf:q4_k_m")  # forget it, leave the files: another tool's download
    monkeypatch.delenv("HF_HOME")
    found = {r.name: r for r in discover_hf_cache()}
    assert "testorg/tiny-gguf:q4_k_m" in found and Path(found["testorg/tiny-gguf:q4_k_m"].path).is_relative_to(shared)
    assert store.resolve("testorg/Tiny-GGUF").path == found["testorg/tiny-gguf:q4_k_m"].path
