"""A model carried by a bundle is served by the mirror on the other side exactly as its lock
describes it: the same repo, commit, tree oid and etag, so one description holds end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.mirror.hosts import home_env, start_mirror

pytestmark = pytest.mark.timeout(180)


def test_bundle_imported_model_is_served_as_its_lock_says(tmp_path, tiny_gguf):
    src, dst, bundle = tmp_path / "src-box", tmp_path / "dst-box", tmp_path / "tiny.bundle"

    def localrun(home, *args):
        done = subprocess.run(
            [sys.executable, "-m", "localrun", *args], env=home_env(home), capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]

    localrun(src, "import", str(tiny_gguf), "--name", "tiny")
    localrun(src, "bundle", "export", "tiny", "-o", str(bundle))
    localrun(dst, "bundle", "import", str(bundle))
    lock = json.loads((bundle / "localrun.lock.json").read_text())
    (model,) = lock["models"]
    (entry,) = model["files"]
    mp = start_mirror(dst)
    try:
        repo = model["repo"]
        info = httpx.get(f"{mp.url}/api/models/{repo}").json()
        assert info["sha"] == model["commit"]
        (tree,) = httpx.get(f"{mp.url}/api/models/{repo}/tree/main").json()
        assert (tree["path"], tree["oid"], tree["lfs"]["oid"], tree["size"]) == (
            entry["path"],
            entry["git_oid"],
            entry["sha256"],
            entry["size"],
        )
        head = httpx.head(f"{mp.url}/{repo}/resolve/main/{entry['path']}")
        assert head.status_code == 200 and head.headers["etag"] == f'"{entry["sha256"]}"'
        assert httpx.get(f"{mp.url}/{repo}/resolve/{model['commit']}/{entry['path']}").content == tiny_gguf.read_bytes()
    finally:
        mp.stop()
    mp = start_mirror(src)  # and the source box serves it under the same repo id
    try:
        assert httpx.get(f"{mp.url}/api/models/{repo}").status_code == 200
    finally:
        mp.stop()
