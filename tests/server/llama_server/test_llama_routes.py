"""llama-server's routes on a real ``localrun serve`` running llama.cpp: /tokenize and
/detokenize round trips, /apply-template, /props, the native /completion and /infill, the
native /embeddings under pooling none, and /rerank on a fixture whose scores are known."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]


@pytest.fixture(scope="module")
def tiny(serve_module, tiny_fim):
    return serve_module(tiny_fim, plan={"n_threads": 1}, n_slots=2, slot_ctx=512)


def post(server, path, body, **kw):
    return httpx.post(f"{server.url}{path}", json=body, timeout=120, **kw)


def test_tokenize_detokenize_round_trip_with_pieces(tiny):
    text = "hello world, the quick fox é"
    plain = post(tiny, "/tokenize", {"content": text}).json()["tokens"]
    assert all(isinstance(t, int) for t in plain)
    special = post(tiny, "/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    assert special == [1, *plain]  # the BOS
    pieces = post(tiny, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == plain
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert raw.decode() == " " + text  # SPM's leading space, as llama-server shows it
    assert any(isinstance(p["piece"], list) for p in pieces)  # é is two byte tokens: bytes, not text
    assert post(tiny, "/detokenize", {"tokens": plain}).json()["content"] == " " + text
    r = post(tiny, "/detokenize", {"tokens": [10**6]})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
    # a 10k-token text tokenizes (the speed is measured in benchmarks/bench_clients.py)
    assert len(post(tiny, "/tokenize", {"content": "hello" * 10_000}).json()["tokens"]) >= 10_000


def test_props_and_apply_template(tiny, tiny_fim):
    props = httpx.get(f"{tiny.url}/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 2
    assert props["chat_template"].startswith("{% for message") and props["chat_template_source"] == "gguf"
    assert props["fim"] is True and props["modalities"] == {"vision": False, "audio": False}
    assert props["model_path"] == str(tiny_fim)  # bound to loopback: the local client may know it
    r = post(tiny, "/apply-template", {"messages": [{"role": "user", "content": "hi"}]})
    assert r.json() == {"prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}


def test_native_completion(tiny):
    r = post(
        tiny,
        "/completion",
        {"prompt": "hello world", "n_predict": 4, "cache_prompt": True, "temperature": 0, "n_probs": 2, "seed": 1},
    )
    out = r.json()
    assert r.status_code == 200, out
    assert out["tokens_predicted"] == 4 and out["tokens_evaluated"] == 3 and out["stop_type"] == "limit"
    assert len(out["completion_probabilities"]) == 4
    assert all(len(p["top_logprobs"]) == 2 and p["logprob"] <= 0 for p in out["completion_probabilities"])
    assert out["timings"]["predicted_n"] == 4
    ids = post(tiny, "/tokenize", {"content": "hello world", "add_special": True}).json()["tokens"]
    by_ids = post(tiny, "/completion", {"prompt": ids, "n_predict": 4, "temperature": 0}).json()
    assert by_ids["content"] == out["content"]
    banned = post(
        tiny, "/completion", {"prompt": "the", "n_predict": 3, "temperature": 0, "logit_bias": [[297, 100.0]]}
    ).json()
    assert banned["content"] == " world" * 3
    with httpx.stream(
        "POST",
        f"{tiny.url}/completion",
        json={"prompt": "hello world", "n_predict": 4, "temperature": 0, "stream": True},
        timeout=120,
    ) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 4
    assert "".join(e["content"] for e in events) == out["content"]
    grammar = post(tiny, "/completion", {"prompt": "x", "grammar": 'root ::= "yes" | "no"', "n_predict": 8}).json()
    assert grammar["content"] in ("yes", "no")


def test_infill_uses_the_fim_tokens(tiny):
    body = {"input_prefix": "hello", "input_suffix": "world", "n_predict": 3, "temperature": 0}
    out = post(tiny, "/infill", body).json()
    n = len(post(tiny, "/tokenize", {"content": "hello"}).json()["tokens"]) + len(
        post(tiny, "/tokenize", {"content": "world"}).json()["tokens"]
    )
    assert out["tokens_evaluated"] == n + 4 and out["tokens_predicted"] == 3
    started = post(tiny, "/infill", {**body, "prompt": "the"}).json()
    assert started["content"].startswith("the") and started["tokens_evaluated"] > out["tokens_evaluated"]
    extra = post(tiny, "/infill", {**body, "input_extra": [{"filename": "a.py", "text": "hello"}]}).json()
    assert extra["tokens_evaluated"] > out["tokens_evaluated"]
    with httpx.stream("POST", f"{tiny.url}/infill", json={**body, "stream": True}, timeout=120) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == out["content"] and events[-1]["stop"] is True


@pytest.fixture(scope="module")
def reranker(serve_module, tiny_reranker):
    path, _ = tiny_reranker
    return serve_module(path, "rank", plan={"n_threads": 1}), serve_module(
        path, "rank", plan={"n_threads": 1}, pooling="none"
    )


def test_rerank_scores_are_the_rank_head_on_the_last_token(reranker, tiny_reranker):
    """The scores are checked against the head applied by hand to the per-token vectors the
    same model gives under pooling none (llama-server's native /embeddings)."""
    ranked, per_token = reranker
    _, head = tiny_reranker
    query, docs = "hello", ["hello world", "the a an", "hello", "what time is it"]
    out = post(ranked, "/v1/rerank", {"query": query, "documents": docs, "return_documents": True}).json()
    got = {r["index"]: r["relevance_score"] for r in out["results"]}
    tok = lambda t: post(ranked, "/tokenize", {"content": t}).json()["tokens"]  # noqa: E731
    expected = {}
    for i, doc in enumerate(docs):
        pair = [1, *tok(query), 2, *tok(doc), 2]  # BOS query EOS (no SEP in this vocabulary) doc EOS
        rows = post(per_token, "/embeddings", {"content": pair}).json()[0]["embedding"]
        assert len(rows) == len(pair)
        z = head @ np.asarray(rows[-1])
        expected[i] = float(np.exp(z[0] - z.max()) / np.exp(z - z.max()).sum())
    assert got == pytest.approx(expected, abs=1e-4)
    best = max(expected, key=expected.get)
    assert out["results"][0]["index"] == best and out["results"][0]["document"] == {"text": docs[best]}
    assert [r["relevance_score"] for r in out["results"]] == sorted(got.values(), reverse=True)
    assert out["usage"]["prompt_tokens"] > 0
    top = post(ranked, "/rerank", {"query": query, "texts": docs, "top_n": 2}).json()["results"]
    assert [r["index"] for r in top] == [r["index"] for r in out["results"][:2]] and "document" not in top[0]


def test_rerank_and_suffix_refused_where_the_model_lacks_them(reranker, tiny):
    ranked, _ = reranker
    r = post(tiny, "/rerank", {"query": "q", "documents": ["a"]})
    assert r.status_code == 400 and "rerank" in r.json()["error"]["message"]
    r = post(ranked, "/v1/completions", {"model": "rank", "prompt": "a", "suffix": "b"})
    assert r.status_code == 400 and "fill-in-the-middle" in json.dumps(r.json())
    r = post(ranked, "/v1/embeddings", {"model": "rank", "input": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
