"""Types are enforced as the APIs' own specs (and the OpenAPI document) state them: a boolean is
not a number, 0 is not a boolean, ``false`` is not a token id.

Before: pydantic's lax mode took ``"temperature": false`` as 0, ``"raw": 0`` as false,
``"prompt": [false]`` as the token id 0 and ``"strict": 0`` as false, while the document said
``number``, ``boolean`` and ``integer``, and OpenAI, Ollama and Anthropic answer each with a 400.
"""

from __future__ import annotations

import pytest

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
STRICT_0 = {**TOOL, "function": {**TOOL["function"], "strict": 0}}


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/v1/chat/completions", {**CHAT, "temperature": False}, "temperature"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": True}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "stream": 0}, "stream"),
        ("/v1/chat/completions", {**CHAT, "tools": [STRICT_0]}, "strict"),
        ("/v1/completions", {"model": "tiny", "prompt": [False], "max_tokens": 2}, "prompt"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "raw": 0, "stream": False}, "raw"),
        ("/api/chat", {**CHAT, "stream": "no"}, "stream"),
        ("/v1/messages", {**CHAT, "temperature": "0.5"}, "temperature"),
    ],
)
def test_a_value_of_the_wrong_json_type_is_a_400_naming_it(app_client, path, body, field):
    r = app_client().post(path, json=body)
    assert r.status_code == 400, (path, field, r.status_code, r.text[:300])
    assert field in r.text, r.text[:300]


def test_numbers_stay_numbers(app_client):
    """An integer where a number is asked is a number in JSON: still accepted."""
    r = app_client().post("/v1/chat/completions", json={**CHAT, "temperature": 1, "top_p": 1})
    assert r.status_code == 200, r.text[:300]


def test_more_choices_than_the_setting_is_a_400_naming_n(app_client):
    """Before: n=128 was taken, and held a real model for 53–90 s even with max_tokens 4."""
    client = app_client(max_choices=4)
    r = client.post("/v1/chat/completions", json={**CHAT, "n": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text[:300]
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2, "n": 1, "best_of": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text[:300]
    assert client.post("/v1/chat/completions", json={**CHAT, "n": 4}).status_code == 200
    default = app_client()
    assert default.post("/v1/chat/completions", json={**CHAT, "n": 128}).status_code == 400


def test_a_whole_number_written_with_a_fraction_is_an_integer(app_client):
    """JSON Schema counts 8.0 an integer; strict validation refused it (found by schemathesis)."""
    r = app_client().post("/v1/chat/completions", json={**CHAT, "max_tokens": 2.0, "seed": -7710711.0})
    assert r.status_code == 200, r.text[:300]
    r = app_client().post("/v1/chat/completions", json={**CHAT, "max_tokens": 2.5})
    assert r.status_code == 400 and "max_tokens" in r.text
