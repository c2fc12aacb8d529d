"""Engine adapters against recorded responses (SGLang, TGI, TRT-LLM, LMDeploy, vLLM errors),
served by a real HTTP server and read through a live localrun with the official openai client.

Sources of the recordings: tests/upstreams/recorded/README.md.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from localrun.runtimes.openai_compat.kinds import KINDS, error_text, scrub, status_error
from tests.upstreams.replay import Reply, chat_sse, models_json, recorded

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def _client(front) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=20)


def test_sglang_recorded_chat_and_completion_streams(replays, front_factory):
    up = replays(
        {
            "GET /health": Reply(200, b""),
            "GET /v1/models": Reply(body=recorded("sglang/models.json")),
            "POST /v1/chat/completions": Reply(body=recorded("sglang/chat_stream.sse"), sse=True),
            "POST /v1/completions": Reply(body=recorded("sglang/completion_stream.sse"), sse=True),
        }
    )
    front = front_factory([{"name": "sg", "url": up.url, "kind": "sglang"}])
    client = _client(front)
    models = {m.id: m for m in client.models.list().data}
    assert models[LLAMA].owned_by == "upstream:sg"
    assert models[LLAMA].model_extra["context_length"] == 131072  # from SGLang's max_model_len
    stream = client.chat.completions.create(
        model=LLAMA,
        messages=[{"role": "user", "content": "capital?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is Paris."
    assert chunks[-1].usage.prompt_tokens == 12 and chunks[-1].usage.completion_tokens == 7
    done = client.completions.create(model=LLAMA, prompt="The capital of France is")
    assert done.choices[0].text == " Paris, the capital of France."
    assert done.choices[0].finish_reason == "length"
    sent = [r for r in up.requests if r["method"] == "POST"]
    assert sent[0]["body"]["stream_options"] == {"include_usage": True}
    assert sent[0]["body"]["top_k"] == 40  # SGLang takes llama.cpp-style knobs


def test_tgi_recorded_stream_under_its_own_model_id(replays, front_factory):
    up = replays(
        {
            "GET /health": Reply(200, b""),
            "GET /v1/models": Reply(body=recorded("tgi/models.json")),
            "POST /v1/chat/completions": Reply(body=recorded("tgi/chat_stream.sse"), sse=True),
        }
    )
    front = front_factory([{"name": "tgi", "url": up.url, "kind": "tgi"}])
    client = _client(front)
    out = client.chat.completions.create(model=LLAMA, messages=[{"role": "user", "content": "capital?"}])
    assert out.choices[0].message.content == "The capital of France is Paris."
    assert out.model == LLAMA and out.id.startswith("chatcmpl-")  # TGI's empty id is not passed on
    assert out.usage.completion_tokens == 7
    body = [r for r in up.requests if r["method"] == "POST"][0]["body"]
    assert body["model"] == LLAMA and "top_k" not in body  # TGI's OpenAI route takes OpenAI's fields only


def test_tgi_refuses_fields_it_cannot_honour_before_sending(replays, front_factory):
    up = replays({"GET /health": Reply(200, b""), "GET /v1/models": Reply(body=recorded("tgi/models.json"))})
    front = front_factory([{"name": "tgi", "url": up.url, "kind": "tgi"}])
    r = httpx.post(front.url + "/v1/embeddings", json={"model": LLAMA, "input": "x"}, timeout=10)
    assert r.status_code == 400 and "upstreams serving" in r.json()["error"]["message"]
    assert not [q for q in up.requests if q["method"] == "POST"]


def test_trtllm_refuses_tools_naming_field_and_runtime(replays, front_factory):
    up = replays({"GET /health": Reply(200, b""), "GET /v1/models": Reply(body=models_json("trt"))})
    front = front_factory([{"name": "trt", "url": up.url, "kind": "trtllm"}])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = httpx.post(
        front.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "trt", "messages": [{"role": "user", "content": "x"}], "tools": tools},
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "tools" and "upstream runtime" in err["message"]


@pytest.mark.parametrize(
    "kind,body,status,code,words",
    [
        ("sglang", "sglang/error.json", 400, "context_length_exceeded", "exceeds the maximum allowed length"),
        ("vllm", "vllm/error.json", 400, "context_length_exceeded", "maximum context length is 4096"),
        ("tgi", "tgi/error.json", 422, "upstream_error", "Input validation error"),
        ("lmdeploy", "lmdeploy/error_404.json", 404, "model_not_found", "does not exist"),
        ("trtllm", "trtllm/error.json", 400, "upstream_error", "max_tokens must be at least 1"),
    ],
)
def test_recorded_error_shapes_become_localrun_errors_naming_the_upstream(
    replays, front_factory, kind, body, status, code, words
):
    up = replays(
        {
            "GET /health": Reply(200, b"{}"),
            "GET /v1/models": Reply(body=models_json("m")),
            "POST /v1/chat/completions": Reply(status, recorded(body)),
        }
    )
    front = front_factory([{"name": f"{kind}-1", "url": up.url, "kind": kind}])
    r = httpx.post(
        front.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        timeout=10,
    )
    err = r.json()["error"]
    assert r.status_code in (400, 404) and err["code"] == code
    assert f"{kind}-1" in err["message"] and words in err["message"]
    r = httpx.post(
        front.url + "/api/chat",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": False},
        timeout=10,
    )
    assert r.status_code in (400, 404) and f"{kind}-1" in r.json()["error"]  # Ollama's shape on /api


@pytest.mark.parametrize(
    "kind,reply",
    [
        ("lmdeploy", Reply(503, recorded("lmdeploy/health_unhealthy.json"))),
        ("trtllm", Reply(503, recorded("trtllm/health_503.txt"), content_type="text/plain")),
        ("lmdeploy", Reply(200, recorded("lmdeploy/health_unhealthy.json"))),
    ],
)
def test_unhealthy_probes_mark_the_upstream_down(replays, kind, reply):
    from localrun.settings import UpstreamConfig, UpstreamSettings
    from localrun.upstreams.pool import UpstreamPool

    up = replays({"GET /health": reply})
    pool = UpstreamPool(
        [UpstreamConfig(name="e", url=up.url, kind=kind, models=["m"])], UpstreamSettings(), start=False
    )
    try:
        pool.probe(pool.get("e"))
        status = pool.status()[0]
        assert status["health"] == "down" and status["detail"]
    finally:
        pool.close()


def test_tgi_error_event_mid_stream_reaches_the_client(replays, front_factory):
    events = chat_sse(["Hello", " there"], usage=False).split(b"\n\n")
    broken = (
        b"\n\n".join(
            events[:2] + [b'data: {"error": "Request failed during generation: CUDA OOM", "error_type": "generation"}']
        )
        + b"\n\n"
    )
    up = replays(
        {
            "GET /health": Reply(200, b""),
            "GET /v1/models": Reply(body=models_json("m")),
            "POST /v1/chat/completions": Reply(body=broken, sse=True),
        }
    )
    front = front_factory([{"name": "tgi", "url": up.url, "kind": "tgi"}])
    with httpx.stream(
        "POST",
        front.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
    ) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert "Hello" in lines[0]
    assert "CUDA OOM" in lines[-1] and "tgi" in lines[-1] and '"error"' in lines[-1]


def test_error_text_reads_every_engine_shape():
    assert error_text(b'{"error": {"message": "bad", "type": "invalid_request_error", "code": 400}}') == (
        "bad",
        "invalid_request_error",
    )
    assert error_text(recorded("sglang/error.json"))[1] == "BadRequestError"
    assert error_text(recorded("tgi/error.json")) == (json.loads(recorded("tgi/error.json"))["error"], "validation")
    assert (
        error_text(b'{"detail": [{"loc": ["body", "model"], "msg": "field required"}]}')[0]
        == "body.model: field required"
    )
    assert error_text(b'{"detail": "Not Found"}')[0] == "Not Found"
    assert error_text(b"Internal Server Error: boom")[0] == "Internal Server Error: boom"


def test_keys_are_scrubbed_from_upstream_errors():
    err = status_error(
        500,
        b'{"error": "bad key sk-secret-123456 in Authorization: Bearer sk-secret-123456"}',
        upstream="u",
        model="m",
        secrets=["sk-secret-123456"],
    )
    assert "sk-secret" not in err.message and "***" in err.message
    assert "abcdefghijkl" not in scrub("Authorization: Bearer abcdefghijkl", [])


def test_every_kind_declares_a_health_path_and_known_capabilities():
    assert set(KINDS) == {"vllm", "sglang", "tgi", "trtllm", "lmdeploy", "llama-server", "ollama", "localrun", "openai"}
    for kind in KINDS.values():
        assert kind.health_path.startswith("/")
        assert kind.capabilities <= {"tools", "json_schema", "logprobs", "embeddings"}


def test_the_kinds_table_agrees_with_the_settings_list_of_kind_names():
    """config.toml accepts exactly the kinds that have a dialect: one list of names, one table."""
    from localrun.settings import UPSTREAM_KINDS

    assert tuple(KINDS) == UPSTREAM_KINDS and all(KINDS[name].name == name for name in UPSTREAM_KINDS)


def test_ollama_kind_probes_api_version_and_streams_its_v1_routes(replays, front_factory):
    up = replays(
        {
            "GET /api/version": Reply(body=b'{"version": "0.12.11"}'),
            "GET /v1/models": Reply(body=models_json("llama3.2:1b")),
            "POST /v1/chat/completions": Reply(body=chat_sse(["Hi", " there"], model="llama3.2:1b"), sse=True),
        }
    )
    front = front_factory([{"name": "ol", "url": up.url, "kind": "ollama"}])
    assert front.pool.get("ol").status()["health"] == "up" and front.pool.get("ol").version == "0.12.11"
    out = _client(front).chat.completions.create(model="llama3.2:1b", messages=[{"role": "user", "content": "x"}])
    assert out.choices[0].message.content == "Hi there"
    body = [q for q in up.requests if q["method"] == "POST"][0]["body"]
    assert "top_k" not in body and body["stream_options"] == {"include_usage": True}
    r = httpx.post(
        front.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "llama3.2:1b", "messages": [{"role": "user", "content": "x"}], "logprobs": True},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"  # not declared for this kind


def test_llama_server_loading_is_down_until_its_health_passes(replays):
    from localrun.settings import UpstreamConfig, UpstreamSettings
    from localrun.upstreams.pool import UpstreamPool

    up = replays(
        {
            "GET /health": Reply(
                503, b'{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}'
            )
        }
    )
    pool = UpstreamPool(
        [UpstreamConfig(name="ls", url=up.url, kind="llama-server", models=["m"])], UpstreamSettings(), start=False
    )
    try:
        pool.probe(pool.get("ls"))
        assert pool.status()[0]["health"] == "down" and "Loading model" in pool.status()[0]["detail"]
        up.routes["GET /health"] = Reply(200, b'{"status": "ok"}')
        pool.probe(pool.get("ls"))
        assert pool.status()[0]["health"] == "up"
    finally:
        pool.close()
