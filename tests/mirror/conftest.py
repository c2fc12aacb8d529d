"""Fixtures: host A's filled store and a mirror serving it.

The index records absolute paths, so a home cannot be copied: read-only tests share one
session mirror; a test that changes A's files fills a home of its own (``fresh_home``).
"""

from __future__ import annotations

import pytest

from tests.hub.fakehub import FakeHub
from tests.hub.repos import populate
from tests.mirror.hosts import fill_store, start_mirror


def _filled(home, tiny_gguf):
    hub = populate(FakeHub()).start()
    try:
        fill_store(home, hub.url, tiny_gguf)
    finally:
        hub.stop()
    return home


@pytest.fixture(scope="session")
def filled_home(tmp_path_factory, tiny_gguf):
    """Host A's home, shared and never modified: pulled GGUF + MLX repos, the imported tiny llama."""
    return _filled(tmp_path_factory.mktemp("host-a"), tiny_gguf)


@pytest.fixture
def fresh_home(tmp_path, tiny_gguf):
    """A host-A home of this test's own (it may change files in it)."""
    from tests.factories import write_tiny_llama_gguf

    own = write_tiny_llama_gguf(tmp_path / "own-tiny" / "tiny-llama.gguf")
    return _filled(tmp_path / "host-a", own)


@pytest.fixture(scope="session")
def mirror(filled_home):
    mp = start_mirror(filled_home)
    yield mp
    mp.stop()
