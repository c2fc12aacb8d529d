"""Fixtures for the capability tests: a real server process, the official clients, and
validation of JSON answers against their schema."""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import build_stack, free_port, spawn_server  # noqa: F401 - fixtures re-exported

ALL = ("tools", "json_schema", "logprobs", "embeddings")


@pytest.fixture
def serve(spawn_server):  # noqa: F811 - the imported fixture
    """``serve(path, name, runtime="fake"|"", plan={...}, **options)``: import the model, start a server, return it."""

    def start(path, name: str, *, runtime: str = "fake", plan: dict | None = None, **options):
        from localrun.modelstore.store import ModelStore
        from localrun.settings import Settings

        ModelStore(Settings()).import_path(path, name=name)
        port = free_port()
        args = ["tests.server.launch", "--port", str(port)]
        for key, value in options.items():
            args += ["--option", f"{key}={json.dumps(value)}"]
        for key, value in (plan or {}).items():
            args += ["--plan", f"{key}={json.dumps(value)}"]
        return spawn_server(args, port=port, env={"LOCALRUN_RUNTIME__FORCE": runtime})

    return start


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
