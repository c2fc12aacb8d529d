"""What the server tests say to a server: the official clients pointed at one, the one-line
requests they repeat, and a check of a JSON answer against its schema."""

from __future__ import annotations

import openai
import pytest

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}


def client_for(server, timeout: float = 60) -> openai.OpenAI:
    """The official ``openai`` client on ``server``'s /v1, no retries (a failure shows at once)."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=timeout)


def anthropic_client(server, **kwargs):
    anthropic = pytest.importorskip("anthropic")
    kwargs.setdefault("api_key", "x")
    return anthropic.Anthropic(base_url=server.url, max_retries=0, timeout=kwargs.pop("timeout", 60), **kwargs)


def chat(client, text="hello there", **fields):
    """One user message to "tiny" through an in-process TestClient."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 8, **fields}
    return client.post("/v1/chat/completions", json=body)


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
