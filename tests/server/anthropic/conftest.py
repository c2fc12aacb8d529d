"""Fixtures for the Anthropic Messages tests: a real server process and the official
``anthropic`` client pointed at it."""

from __future__ import annotations

import pytest

from tests.support.capabilities import ALL
from tests.support.clients import anthropic_client


@pytest.fixture
def fake_server(serve, tiny_gguf):
    """A real server on the fake runtime declaring every optional capability, short answers."""
    return serve(tiny_gguf, "tiny", fake_capabilities=list(ALL), fake_reply_words=6)


@pytest.fixture
def claude(fake_server):
    with anthropic_client(fake_server) as client:
        yield client


@pytest.fixture
def anthropic_app(caps_client):
    """The app in-process (fake runtime, every capability, max_tokens capped at 8): for fuzzing."""
    return caps_client
