"""Fixtures for bundle tests: a source store with models to export, and a second, empty
machine (its own LOCALRUN_HOME and HF cache) to import into.

``Machine.use()`` points the environment at one machine; tests switch between the exporting
and the importing side the way two hosts would, with nothing shared but the bundle.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hub.conftest import fake_hub  # noqa: F401  (re-exported fixture)


@dataclass
class Machine:
    home: Path
    monkeypatch: pytest.MonkeyPatch

    @property
    def hf_cache(self) -> Path:
        return self.home / "hf" / "hub"

    def use(self) -> Machine:
        self.monkeypatch.setenv("LOCALRUN_HOME", str(self.home))
        self.monkeypatch.setenv("HF_HOME", str(self.home / "hf"))
        self.monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        return self

    def store(self):
        from localrun.modelstore.store import ModelStore
        from localrun.settings import load_settings

        self.use()
        return ModelStore(load_settings())

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_HUB_CACHE", "LOCALRUN_"))}
        env.update(LOCALRUN_HOME=str(self.home), HF_HOME=str(self.home / "hf"), HF_HUB_OFFLINE="1")
        return env

    def blobs(self) -> dict[str, str]:
        """Every blob in this machine's HF cache -> its sha256 (what a clean import leaves)."""
        return {
            str(p.relative_to(self.hf_cache)): sha256_file(p) for p in sorted(self.hf_cache.glob("models--*/blobs/*"))
        }

    def state(self) -> tuple:
        """Index rows and cache contents, comparable between two machines' imports."""
        rows = sorted(
            (
                r.name,
                r.format.value,
                r.repo,
                r.revision,
                r.source.value,
                tuple((os.path.relpath(f.path, self.hf_cache), f.size, f.sha256) for f in r.files),
            )
            for r in self.store().list()
        )
        links = sorted(
            (str(p.relative_to(self.hf_cache)), os.readlink(p))
            for p in self.hf_cache.glob("models--*/snapshots/**/*")
            if p.is_symlink()
        )
        partials = sorted(str(p) for p in self.hf_cache.rglob("*.bundle-partial"))
        return rows, self.blobs(), links, partials


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def source(_isolated_home, monkeypatch) -> Machine:
    """The exporting machine (the test's isolated home), active."""
    return Machine(_isolated_home, monkeypatch).use()


@pytest.fixture
def target(tmp_path, monkeypatch) -> Machine:
    """A second machine with nothing on it (not active until ``.use()``)."""
    return Machine(tmp_path / "target-home", monkeypatch)


@pytest.fixture
def tiny_model(source, tiny_gguf):
    """The tiny loadable GGUF imported (in place) into the source store as ``tiny``."""
    return source.store().import_path(tiny_gguf, name="tiny")
