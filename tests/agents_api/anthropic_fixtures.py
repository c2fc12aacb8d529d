"""Fixtures for the Anthropic Messages tests: a real server process and the official
``anthropic`` client pointed at it. Imported by the test modules (the capability tests'
``serve`` launcher does the work)."""

from __future__ import annotations

import pytest

from tests.capabilities.conftest import caps_client, serve  # noqa: F401 - fixtures re-exported
from tests.server.conftest import build_stack, free_port, spawn_server  # noqa: F401 - fixtures re-exported

ALL = ("tools", "json_schema", "logprobs", "embeddings")


def anthropic_client(server, **kwargs):
    anthropic = pytest.importorskip("anthropic")
    kwargs.setdefault("api_key", "x")
    return anthropic.Anthropic(base_url=server.url, max_retries=0, timeout=kwargs.pop("timeout", 60), **kwargs)


@pytest.fixture
def fake_server(serve, tiny_gguf):  # noqa: F811 - the imported fixture
    """A real server on the fake runtime declaring every optional capability, short answers."""
    return serve(tiny_gguf, "tiny", fake_capabilities=list(ALL), fake_reply_words=6)


@pytest.fixture
def claude(fake_server):
    with anthropic_client(fake_server) as client:
        yield client


@pytest.fixture
def anthropic_app(caps_client):  # noqa: F811 - the imported fixture
    """The app in-process (fake runtime, every capability, max_tokens capped at 8): for fuzzing."""
    return caps_client


WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                            "required": ["city", "days"]}}
