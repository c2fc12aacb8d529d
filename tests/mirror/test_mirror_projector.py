"""The mirror serves a model's projector with it, and a pull through the mirror gets the pair.

Host A pulls a vision repo from the fake hub and imports a model paired by hand; a real
``localrun mirror`` serves A's store; host B pulls both through it with ``localrun pull``."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import httpx
import pytest

from tests.hub import repos
from tests.hub.fakehub import FakeHub
from tests.mirror.hosts import home_env, start_mirror
from tests.support.projectors import make_projector

pytestmark = pytest.mark.timeout(180)

REPO = "visionorg/Mirrored-GGUF"
FILES = {
    "Mirrored-Q4_K_M.gguf": repos.make_gguf(seed=701),
    "mmproj-Mirrored-F16.gguf": make_projector(seed=41),
    "mmproj-Mirrored-Q8_0.gguf": make_projector(seed=42, file_type=7),
}


def _localrun(home, *args, **env) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "localrun", *args],
        env={**home_env(home), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_mirror_serves_both_files_and_a_pull_through_it_gets_the_pair(tmp_path):
    a, b = tmp_path / "host-a", tmp_path / "host-b"
    hub = FakeHub()
    hub.add_repo(REPO, FILES)
    hub.start()
    try:
        _localrun(a, "pull", "-y", REPO, HF_ENDPOINT=hub.url)
    finally:
        hub.stop()
    (tmp_path / "own").mkdir()
    model, proj = tmp_path / "own" / "omni-Q8_0.gguf", tmp_path / "own" / "mmproj-omni.gguf"
    model.write_bytes(repos.make_gguf(quant="Q8_0", seed=702))
    proj.write_bytes(make_projector(vision=True, audio=True, seed=43))
    _localrun(a, "import", str(model), "--mmproj", str(proj), "--name", "omni")

    mp = start_mirror(a)
    try:
        tree = {e["path"]: e for e in httpx.get(f"{mp.url}/api/models/{REPO}/tree/main").json()}
        assert set(tree) == {"Mirrored-Q4_K_M.gguf", "mmproj-Mirrored-Q8_0.gguf"}  # what A pulled, the pair
        for path, entry in tree.items():
            body = httpx.get(f"{mp.url}/{REPO}/resolve/main/{path}").content
            assert body == FILES[path] and entry["lfs"]["oid"] == hashlib.sha256(body).hexdigest()
        local = {e["path"] for e in httpx.get(f"{mp.url}/api/models/local/omni/tree/main").json()}
        assert local == {"omni-Q8_0.gguf", "mmproj-omni.gguf"}

        _localrun(b, "pull", "-y", REPO, HF_ENDPOINT=mp.url)
        _localrun(b, "pull", "-y", "local/omni", HF_ENDPOINT=mp.url)
    finally:
        mp.stop()
    rows = {r["name"]: r for r in json.loads(_localrun(b, "ls", "--json"))}
    pulled = rows["visionorg/mirrored-gguf:q4_k_m"]
    assert pulled["capabilities"] == ["completion", "vision"]
    assert pulled["projector"].endswith("mmproj-Mirrored-Q8_0.gguf")
    omni = rows["local/omni:q8_0"]
    assert omni["capabilities"] == ["completion", "vision", "audio"] and omni["projector"].endswith("mmproj-omni.gguf")
    assert "ok" in _localrun(b, "verify")
