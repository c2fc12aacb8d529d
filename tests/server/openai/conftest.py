"""Fixtures for the OpenAI-family tests: a real server process on the fake runtime declaring
every optional capability, and the official client on it."""

from __future__ import annotations

import pytest

from tests.support.capabilities import ALL
from tests.support.clients import client_for


@pytest.fixture
def server(serve, tiny_gguf):
    """A real server on the fake runtime declaring every optional capability."""
    return serve(tiny_gguf, "tiny", fake_capabilities=list(ALL))


@pytest.fixture
def oai(server):
    with client_for(server, timeout=30) as client:
        yield client
