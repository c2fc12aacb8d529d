"""Fixtures for hub tests: a populated fake hub on loopback, the env pointing at it, a store.

Other test folders can use the hub too: ``from tests.hub.fakehub import FakeHub`` and
``from tests.hub.repos import populate``, or import the ``fake_hub`` fixture in their own
conftest (``from tests.hub.conftest import fake_hub  # noqa: F401``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hub.fakehub import FakeHub
from tests.hub.repos import populate

_HUB_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_TOKEN_PATH",
    "LOCALRUN_HUB__ENDPOINT",
    "LOCALRUN_HUB__OFFLINE",
)


@pytest.fixture
def fake_hub(monkeypatch):
    """A started FakeHub with the standard repos; HF_ENDPOINT points at it; no token, online."""
    hub = populate(FakeHub()).start()
    for var in _HUB_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield hub
    hub.stop()


@pytest.fixture
def hf_cache(_isolated_home) -> Path:
    """Where pulls land: $HF_HOME/hub under the test's isolated home."""
    from localrun.modelstore.hub import hub_cache_dir

    return hub_cache_dir()


@pytest.fixture
def store(_isolated_home):
    """The model store pulls register into, under the test's isolated home."""
    from localrun.modelstore.store import ModelStore
    from localrun.settings import load_settings

    return ModelStore(load_settings())
