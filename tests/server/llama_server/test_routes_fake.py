"""The llama-server routes, aliases and /health on the fake runtime: shapes the server owns
(model choice, aliases, liveness without a key) and the 400s of a runtime lacking a call."""

from __future__ import annotations


def test_unprefixed_openai_aliases_answer_like_v1(app_client):
    client = app_client()
    assert client.get("/models").json()["data"][0]["id"] == "tiny"
    assert client.get("/models/tiny").json()["id"] == "tiny"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    assert (
        client.post("/chat/completions", json=body).json()["choices"]
        == client.post("/v1/chat/completions", json=body).json()["choices"]
    )
    r = client.post("/completions", json={"model": "tiny", "prompt": "a b", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    r = client.post("/embeddings", json={"model": "tiny", "input": ["one two"]})
    assert r.status_code == 200 and r.json()["object"] == "list" and r.json()["usage"]["prompt_tokens"] == 2


def test_a_runtime_without_token_access_says_so(app_client):
    client = app_client()
    for path, body in (
        ("/tokenize", {"content": "hi"}),
        ("/detokenize", {"tokens": [1]}),
        ("/apply-template", {"messages": [{"role": "user", "content": "x"}]}),
    ):
        r = client.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        assert "fake runtime" in r.json()["error"]["message"]
    r = client.post("/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "query" and "rerank" in str(r.json()["error"])
    r = client.post("/completion", json={"prompt": "x", "grammar": 'root ::= "a"'})
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"


def test_props_names_the_model_file_only_on_loopback(app_client, tiny_gguf):
    local = app_client().get("/props").json()
    assert local["model_path"] == str(tiny_gguf) and local["default_generation_settings"]["n_ctx"] == 2048
    assert local["model_alias"] == "tiny" and local["modalities"] == {"vision": False, "audio": False}
    remote = app_client(host="0.0.0.0", api_key="k-test-key", allowed_hosts=["localhost"])
    r = remote.get("/props", headers={"Authorization": "Bearer k-test-key"})
    assert r.status_code == 200 and "model_path" not in r.json() and str(tiny_gguf) not in r.text


def test_native_completion_shape_on_the_fake_runtime(app_client):
    client = app_client()
    r = client.post("/completion", json={"prompt": "one two three", "n_predict": 3, "cache_prompt": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["tokens_predicted"] == 3 and out["tokens_evaluated"] == 3 and out["stop"] is True
    assert out["stop_type"] == "limit" and out["content"] and out["model"] == "tiny"
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms"} <= set(out["timings"])
    with client.stream("POST", "/completion", json={"prompt": "one two", "n_predict": 2, "stream": True}) as s:
        events = [line for line in s.iter_lines() if line.startswith("data: ")]
    import json

    parsed = [json.loads(e[6:]) for e in events]
    assert [p["stop"] for p in parsed] == [False] * (len(parsed) - 1) + [True]
    assert "".join(p["content"] for p in parsed) and parsed[-1]["tokens_predicted"] == 2


def test_the_model_must_be_named_when_there_are_several(app_client, tiny_gguf):
    client = app_client()
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

    ModelStore(Settings()).import_path(tiny_gguf, name="other")
    r = client.post("/completion", json={"prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert client.post("/completion", json={"prompt": "x", "model": "other", "n_predict": 1}).status_code == 200


def test_health_without_the_key_is_liveness_only(app_client):
    client = app_client(api_key="sekrit-key")
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert client.get("/health", headers={"Authorization": "Bearer wrong"}).json() == {"status": "ok"}
    full = client.get("/health", headers={"Authorization": "Bearer sekrit-key"}).json()
    assert "pid" in full and "models" in full
    assert (
        client.get("/metrics").status_code == 401 and client.post("/tokenize", json={"content": "x"}).status_code == 401
    )
    assert client.post("/health").status_code in (401, 405)  # only a GET is a probe


def test_rerank_bounds_and_shapes(app_client):
    client = app_client()
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["a"] * 1025})
    assert r.status_code == 400 and "documents" in r.json()["error"]["message"]
    r = client.post("/rerank", json={"query": "q", "documents": ["a"], "texts": ["b"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "texts"
    r = client.post("/rerank", json={"query": "q"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
    for path, field in (("/rerank", "documents"), ("/v1/rerank", "documents"), ("/rerank", "texts")):
        r = client.post(path, json={"query": "q", field: []})  # nothing to rank: llama-server's 400 too
        assert r.status_code == 400 and r.json()["error"]["param"] == field
