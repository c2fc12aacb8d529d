"""``POST /responses`` without ``/v1`` works like OpenAI's other bare aliases (llama.cpp's own server
tests call it so; it was the one 404)."""

from __future__ import annotations


def test_bare_responses_routes_answer_like_v1(app_client):
    client = app_client()
    r = client.post("/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 4})
    assert r.status_code == 200, r.text
    made = r.json()
    assert made["object"] == "response" and made["status"] in ("completed", "incomplete")
    assert client.get(f"/responses/{made['id']}").json()["id"] == made["id"]
    assert client.get(f"/v1/responses/{made['id']}").status_code == 200  # one store behind both paths
    assert client.delete(f"/responses/{made['id']}").json()["deleted"] is True
    assert client.get(f"/v1/responses/{made['id']}").status_code == 404


def test_bare_responses_errors_are_openai_shaped(app_client):
    r = app_client().post("/responses", json={"input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
