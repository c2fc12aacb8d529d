"""A refused pull leaves nothing in the shared HF cache, and a pull whose files vanish under it
(a ``localrun rm`` at the same time) ends in a message, not ``FileNotFoundError``."""

from __future__ import annotations

import os

import pytest

from localrun.errors import DownloadFailed, InvalidModelFile
from localrun.modelstore.pull import pull
from tests.hub import repos


def test_a_refused_gguf_is_removed_from_the_shared_cache(fake_hub, store, hf_cache):
    fake_hub.add_repo("testorg/Broken-GGUF", {"Broken-Q4_K_M.gguf": b"GGUF" + b"\xff" * 60})
    with pytest.raises(InvalidModelFile):
        pull(store, "testorg/Broken-GGUF")
    folder = hf_cache / "models--testorg--Broken-GGUF"
    left = [p for p in folder.rglob("*") if p.is_file() or p.is_symlink()] if folder.exists() else []
    assert [p for p in left if "blobs" in p.parts or "snapshots" in p.parts] == [], left


def test_a_file_removed_while_it_is_pulled_is_a_message(fake_hub, store, monkeypatch):
    real = store.inspect_path

    def removed_after(path, **kw):  # what a concurrent `localrun rm` does between fetch and register
        described = real(path, **kw)
        os.unlink(os.path.realpath(path))
        os.unlink(path)
        return described

    monkeypatch.setattr(store, "inspect_path", removed_after)
    with pytest.raises(DownloadFailed, match="was removed while it was being pulled"):
        pull(store, repos.GGUF_REPO)
    assert store.list() == []
