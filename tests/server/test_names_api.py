"""Names over every API family: a typo's 404 names the nearest model, and an Ollama-style
``hf.co/org/repo:QUANT`` reaches what was pulled from that repo (issue 33)."""

from __future__ import annotations

import dataclasses

import pytest

from localrun.types import Source
from tests.hub import repos

CHAT = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/chat/completions": lambda m: {"model": m, "messages": CHAT, "max_tokens": 2},
    "/api/chat": lambda m: {"model": m, "messages": CHAT, "stream": False},
    "/v1/messages": lambda m: {"model": m, "messages": CHAT, "max_tokens": 2},
    "/v1/responses": lambda m: {"model": m, "input": "hi", "max_output_tokens": 16},
}


@pytest.mark.parametrize("route", list(BODIES))
def test_a_typo_404_names_the_nearest_model(client, route):
    r = client.post(route, json=BODIES[route]("tinny"))
    assert r.status_code == 404, r.text
    assert "did you mean tiny" in r.text


def test_api_show_suggests_too(client):
    r = client.post("/api/show", json={"model": "tinny"})
    assert r.status_code == 404 and "did you mean tiny" in r.text


@pytest.mark.parametrize("route", list(BODIES))
def test_a_hub_reference_reaches_what_was_pulled(stack, client, tmp_path, route):
    path = tmp_path / "X-Q4_K_M.gguf"
    path.write_bytes(repos.make_gguf(seed=1))
    rec = stack.store.inspect_path(path, name="acme/x-gguf:q4_k_m")
    stack.store.register(dataclasses.replace(rec, repo="acme/x-GGUF", source=Source.HUB))
    r = client.post(route, json=BODIES[route]("hf.co/acme/x-GGUF:Q4_K_M"))
    assert r.status_code == 200, r.text
    assert stack.manager.is_loaded("acme/x-gguf:q4_k_m")


@pytest.mark.parametrize("route", list(BODIES))
def test_a_model_only_another_app_holds_is_served_by_its_listed_name(stack, client, monkeypatch, tmp_path, route):
    monkeypatch.setenv("HOME", str(tmp_path))
    repo = tmp_path / ".lmstudio" / "models" / "lmstudio-community" / "Tiny-GGUF"
    repo.mkdir(parents=True)
    (repo / "Tiny-Q4_K_M.gguf").write_bytes(repos.make_gguf(seed=41))
    r = client.post(route, json=BODIES[route]("lmstudio-community/tiny-gguf:q4_k_m"))
    assert r.status_code == 200, r.text
    assert stack.manager.is_loaded("lmstudio-community/tiny-gguf:q4_k_m") and stack.store.list()[0].name == "tiny"
