"""Real streams of every SSE route match the event schema the document gives them (``itemSchema``).

Before: every streamed answer was documented as ``text/event-stream`` with ``schema: string``,
so no tool or client generator saw the events' shapes (and schemathesis, which reads such a
schema per event, failed /admin/events' first event).
"""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
STREAMS = {
    "/v1/chat/completions": CHAT,
    "/chat/completions": CHAT,
    "/v1/completions": {"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": True},
    "/completions": {"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": True},
    "/v1/messages": CHAT,
    "/v1/responses": {"model": "tiny", "input": "hi", "max_output_tokens": 3, "stream": True},
    "/responses": {"model": "tiny", "input": "hi", "max_output_tokens": 3, "stream": True},
    "/completion": {"model": "tiny", "prompt": "hi", "n_predict": 3, "stream": True},
}


def _events(text: str) -> list[dict[str, str]]:
    """The events of an SSE body, as the spec frames them (comments dropped, data lines joined)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            event[name] = f"{event[name]}\n{value}" if name == "data" and name in event else value
        if event:
            events.append(event)
    return events


def _check(schema: dict, event: dict[str, str]) -> None:
    Draft202012Validator(schema).validate(event)
    if event["data"] == "[DONE]":
        return
    data = schema["properties"]["data"]
    content = next(s for s in data.get("anyOf", [data]) if "contentSchema" in s)["contentSchema"]
    Draft202012Validator(content).validate(json.loads(event["data"]))


@pytest.mark.parametrize("path", sorted(STREAMS))
def test_a_real_stream_matches_its_documented_events(app_client, path):
    client = app_client()  # (/infill streams /completion's chunks; the fake runtime has no FIM tokens for it)
    document = client.get("/openapi.json").json()
    media = document["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
    schema = media["itemSchema"]
    r = client.post(path, json=STREAMS[path])
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text[:300]
    events = _events(r.text)
    assert events
    for event in events:
        _check(schema, event)
    # the check can fail: an event of another family's shape does not pass
    with pytest.raises(Exception):  # noqa: B017, PT011 - any validation error
        _check(schema, {"data": json.dumps({"unexpected": True}), "event": "nonsense"})


def test_the_status_feed_matches_its_documented_events(app_client):
    client = app_client()
    schema = client.get("/openapi.json").json()["paths"]["/admin/events"]["get"]["responses"]["200"]["content"]
    with client.stream("GET", "/admin/events") as r:
        first = ""
        for line in r.iter_lines():
            first += line + "\n"
            if line == "" and "data:" in first:
                break
    _check(schema["text/event-stream"]["itemSchema"], _events(first)[0])
