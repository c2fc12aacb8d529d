"""Fixtures for the capability tests: a real server process, the official clients, and
validation of JSON answers against their schema."""

from __future__ import annotations


import pytest

from tests.server.conftest import build_stack, free_port, launch_args, spawn_server  # noqa: F401 - fixtures re-exported

ALL = ("tools", "json_schema", "logprobs", "embeddings")


@pytest.fixture
def serve(spawn_server):  # noqa: F811 - the imported fixture
    """``serve(path, name, runtime="fake"|"", plan={...}, **options)``: import the model, start a server, return it."""

    def start(path, name: str, *, runtime: str = "fake", plan: dict | None = None, **options):
        from localrun.modelstore.store import ModelStore
        from localrun.settings import Settings

        ModelStore(Settings()).import_path(path, name=name)
        port = free_port()
        args = launch_args(port, options, plan)
        return spawn_server(args, port=port, env={"LOCALRUN_RUNTIME__FORCE": runtime})

    return start


@pytest.fixture
def server(serve, tiny_gguf):
    """A real server on the fake runtime declaring every optional capability."""
    return serve(tiny_gguf, "tiny", fake_capabilities=list(ALL))


@pytest.fixture
def oai(server):
    import openai

    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture
def caps_client(build_stack):  # noqa: F811 - the imported fixture
    """The app in-process (fake runtime, every capability, max_tokens capped at 8), for fuzzing."""
    from fastapi.testclient import TestClient

    from localrun.server.app import create_app
    from tests.server.conftest import fake_planner

    stack = build_stack(planner=fake_planner(fake_capabilities=list(ALL)), runtime={"max_tokens_cap": 8})
    with TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost", raise_server_exceptions=False) as c:
        yield c


def ask(oai, text, **kwargs):
    """One user message to the fake server's "tiny" model."""
    kwargs.setdefault("max_tokens", 64)
    return oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}], **kwargs)


def validate(instance, schema) -> None:
    """jsonschema when installed; else the checks these tests' schemas need."""
    try:
        import jsonschema
    except ImportError:
        _check(instance, schema)
    else:
        jsonschema.validate(instance, schema)


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _check(value, schema) -> None:
    kind = schema.get("type")
    if "enum" in schema:
        assert value in schema["enum"], (value, schema["enum"])
    if kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), value
    elif kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), value
    elif kind in _TYPES:
        assert isinstance(value, _TYPES[kind]), (value, kind)
    if kind == "object":
        for key in schema.get("required", ()):
            assert key in value, (key, value)
        props = schema.get("properties", {})
        for key, sub in value.items():
            if schema.get("additionalProperties") is False:
                assert key in props, key
            if key in props:
                _check(sub, props[key])
    if kind == "array":
        assert len(value) >= schema.get("minItems", 0)
        for item in value:
            _check(item, schema.get("items", {}))
    if kind == "string":
        assert len(value) >= schema.get("minLength", 0)
