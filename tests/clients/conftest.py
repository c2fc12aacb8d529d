"""Fixtures for the client-compatibility tests: in-process apps on the fake runtime for the
server layers, and real ``localrun serve`` processes on llama.cpp (reused from the
capability tests) for the parameters and routes themselves."""

from __future__ import annotations

import pytest

from tests.capabilities.conftest import serve  # noqa: F401 - fixture re-exported
from tests.server.conftest import build_stack, fake_planner, free_port, spawn_server  # noqa: F401 - fixtures re-exported

ALL = ["tools", "json_schema", "logprobs", "embeddings", "n"]


@pytest.fixture
def app_client(build_stack):  # noqa: F811 - the imported fixture
    """``app_client(capabilities=[...], **server_settings)``: a TestClient on the fake runtime."""
    from fastapi.testclient import TestClient

    from localrun.server.app import create_app

    opened = []

    def make(capabilities=ALL, **server):
        stack = build_stack(planner=fake_planner(fake_capabilities=list(capabilities)), **server)
        client = TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost",
                            raise_server_exceptions=False)
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


def chat(client, text="hello there", **fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 8, **fields}
    return client.post("/v1/chat/completions", json=body)
