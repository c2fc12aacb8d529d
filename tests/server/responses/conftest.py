"""Fixtures for the Responses API tests: real server processes shared by a module.

A server process takes a few seconds to start on a loaded machine, and the Responses
tests ask one server many questions, so a module starts each kind once: under its own
LOCALRUN_HOME (the per-test one is function-scoped), stopped when the module ends.
"""

from __future__ import annotations

import pytest

from tests.support import servers
from tests.support.capabilities import ALL
from tests.support.clients import client_for


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory, tiny_gguf):
    """A real server on the fake runtime declaring every optional capability."""
    server = servers.start_in_home(tmp_path_factory.mktemp("resp-home"), tiny_gguf, "tiny", fake_capabilities=list(ALL))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory, tiny_gguf):
    """A real server on the fake runtime declaring no optional capability."""
    server = servers.start_in_home(tmp_path_factory.mktemp("resp-bare"), tiny_gguf, "tiny", fake_capabilities=[])
    yield server
    server.stop()


@pytest.fixture
def oai(fake_server):
    with client_for(fake_server) as client:
        yield client
