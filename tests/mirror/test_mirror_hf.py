"""The real huggingface_hub (and `hf download`) against a real `localrun mirror`, on loopback:
host B's files equal host A's byte for byte, and B's cache is a normal HF cache."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from tests.hub import repos
from tests.mirror.hosts import TINY_REPO, home_env

pytestmark = pytest.mark.timeout(180)

REPOS = [repos.GGUF_REPO, repos.MLX_REPO, TINY_REPO]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_b(home, url, *args, timeout=120, **env) -> subprocess.CompletedProcess:
    e = {**home_env(home), "HF_ENDPOINT": url, **env}
    return subprocess.run([sys.executable, *args], env=e, capture_output=True, text=True, timeout=timeout)


def test_huggingface_hub_downloads_byte_equal_files(mirror, tmp_path, tiny_gguf):
    done = run_b(tmp_path / "host-b", mirror.url, "-m", "tests.mirror.client_b", "hf", *REPOS)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    gguf = seen["repos"][repos.GGUF_REPO]
    assert gguf["files"] == {"Tiny-Q4_K_M.gguf": _sha(repos.gguf_repo_files()["Tiny-Q4_K_M.gguf"])}
    mlx = seen["repos"][repos.MLX_REPO]
    expected = {p: _sha(d) for p, d in repos.mlx_repo_files().items()}
    assert mlx["files"] == {p: expected[p] for p in mlx["files"]} and "config.json" in mlx["files"]
    assert mlx["files"].keys() == set(mlx["siblings"]) == set(mlx["list_repo_files"])
    tiny = seen["repos"][TINY_REPO]
    assert tiny["files"] == {"tiny-llama.gguf": _sha(tiny_gguf.read_bytes())}
    for repo in REPOS:
        r = seen["repos"][repo]
        assert r["single"][1] == r["files"][r["single"][0]]
        assert r["branches"]["main"] == r["sha"]
        for e in r["tree"]:  # the etag huggingface_hub cached under is the tree's lfs oid or oid
            assert e["lfs"] == (r["files"][e["path"]] if e["lfs"] else None)
        assert sorted(seen["cache"][repo]) == sorted(r["files"])
    assert set(REPOS) <= set(seen["search"]["tiny"]) and seen["search"]["nothing-like-this"] == []


def test_tree_matches_the_hub_it_was_pulled_from(mirror):
    """size, lfs.oid and a plain file's oid are what the origin hub listed; an LFS file's oid
    is its pointer's git sha1, as on the real hub (the fake hub lists the content's sha1)."""
    import httpx

    from localrun.modelstore.gitids import lfs_git_oid
    from tests.hub.fakehub import FakeHub
    from tests.hub.repos import populate

    hub = populate(FakeHub()).start()
    try:
        for repo in (repos.GGUF_REPO, repos.MLX_REPO):
            origin = {e["path"]: e for e in httpx.get(f"{hub.url}/api/models/{repo}/tree/main?recursive=true").json()}
            ours = httpx.get(f"{mirror.url}/api/models/{repo}/tree/main", params={"recursive": "true"}).json()
            assert ours, repo
            for e in ours:
                o = origin[e["path"]]
                assert e["size"] == o["size"] and e["type"] == "file"
                if "lfs" in o:
                    assert e["lfs"]["oid"] == o["lfs"]["oid"] and e["lfs"]["size"] == o["size"]
                    assert e["oid"] == lfs_git_oid(o["lfs"]["oid"], o["size"])
                else:
                    assert "lfs" not in e and e["oid"] == o["oid"]
    finally:
        hub.stop()


def test_hf_cli_download(mirror, tmp_path):
    hf = [sys.executable, "-c", "from huggingface_hub.cli.hf import main; main()"]
    target = tmp_path / "dl"
    done = run_b(
        tmp_path / "b", mirror.url, *hf[1:], "download", repos.GGUF_REPO, "Tiny-Q4_K_M.gguf", "--local-dir", str(target)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (target / "Tiny-Q4_K_M.gguf").read_bytes() == repos.gguf_repo_files()["Tiny-Q4_K_M.gguf"]
