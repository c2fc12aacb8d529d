"""Nothing a request carries can outgrow the worker pipe's frame (localrun/frames.py).

Before: ``/api/generate`` with a ``context`` of 9 M token ids, or ``/v1/embeddings`` with 11
lists of 1 M ids, became a worker frame over its 64 MiB bound, and the worker exited ("Broken
pipe", a 503 for everything in flight). Now the server counts a body's token ids before any
model sees them, and refuses more than ``MAX_TOKEN_IDS`` with a 413 that names the field.
"""

from __future__ import annotations

import json

from localrun.frames import MAX_HEADER_BYTES
from localrun.server.validate import MAX_TOKEN_IDS, count_ids


def _post(client, path: str, body: dict):
    raw = json.dumps(body, separators=(",", ":")).encode()
    return client.post(path, content=raw, headers={"content-type": "application/json"})


def test_the_bound_fits_a_frame_with_room_for_text():
    assert MAX_TOKEN_IDS * len(f"{2**31 - 1},") <= MAX_HEADER_BYTES * 0.7
    assert count_ids({"a": [1, [2, 3], {"b": [4]}], "c": "text", "d": 5}) == 4


def test_a_context_of_too_many_token_ids_is_a_413_naming_it(app_client):
    client = app_client(max_body_bytes=32 * 1024 * 1024)
    r = _post(client, "/api/generate", {"model": "tiny", "prompt": "hi", "context": [1] * (MAX_TOKEN_IDS + 1)})
    assert r.status_code == 413, r.text[:300]
    assert "'context'" in r.json()["error"] and str(MAX_TOKEN_IDS) in r.json()["error"]


def test_embedding_inputs_of_too_many_token_ids_are_a_413_naming_them(app_client):
    client = app_client(max_body_bytes=32 * 1024 * 1024)
    lists = [[7] * 1_000_000 for _ in range(MAX_TOKEN_IDS // 1_000_000 + 1)]
    for path in ("/v1/embeddings", "/embeddings"):
        field = "input" if path == "/v1/embeddings" else "content"
        r = _post(client, path, {"model": "tiny", field: lists})
        assert r.status_code == 413, (path, r.text[:300])
        error = r.json()["error"]
        assert error["param"] == field and "token ids" in error["message"], error


def test_a_body_with_fewer_ids_than_the_bound_is_served(app_client):
    client = app_client(max_body_bytes=32 * 1024 * 1024)
    r = _post(client, "/v1/embeddings", {"model": "tiny", "input": [[7] * 1000, [8] * 1000]})
    assert r.status_code != 413, r.text[:300]
