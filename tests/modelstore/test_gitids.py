"""The hub's ids, computed once for bundles and the mirror: they must be git's and the hub's exactly."""

from __future__ import annotations

import hashlib

from localrun.modelstore.gitids import (
    git_blob_hasher,
    git_blob_oid,
    is_lfs_path,
    lfs_git_oid,
    lfs_pointer,
    synthetic_commit,
    synthetic_repo,
)


def test_git_blob_oids_are_gits():
    assert git_blob_oid(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # `git hash-object /dev/null`
    assert git_blob_oid(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"
    streamed = git_blob_hasher(6)
    streamed.update(b"hel")
    streamed.update(b"lo\n")
    assert streamed.hexdigest() == git_blob_oid(b"hello\n")


def test_an_lfs_files_tree_oid_is_its_pointers():
    sha = hashlib.sha256(b"weights").hexdigest()
    pointer = lfs_pointer(sha, 7)
    assert pointer == f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize 7\n".encode()
    assert lfs_git_oid(sha, 7) == git_blob_oid(pointer)
    assert is_lfs_path("model.GGUF", 10) and is_lfs_path("notes.txt", 64 << 20) and not is_lfs_path("config.json", 10)


def test_synthetic_ids_are_stable_and_valid():
    assert synthetic_repo("My Model:Q4_K_M") == synthetic_repo("My Model:Q4_K_M") == "local/my_model_q4_k_m"
    assert synthetic_repo("...") == "local/model"
    a = synthetic_commit("local/m", [("b", "2" * 64), ("a", "1" * 64)])
    assert a == synthetic_commit("local/m", [("a", "1" * 64), ("b", "2" * 64)]) and len(a) == 40
    assert a != synthetic_commit("local/n", [("a", "1" * 64), ("b", "2" * 64)])


def test_the_mirrors_catalog_speaks_no_http():
    """hub_catalog is store logic: importing it pulls in no HTTP stack (server/mirror does the HTTP)."""
    import subprocess
    import sys

    code = (
        "import sys, localrun.modelstore.hub_catalog; "
        "print(','.join(m for m in ('httpx', 'fastapi', 'starlette', 'uvicorn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
