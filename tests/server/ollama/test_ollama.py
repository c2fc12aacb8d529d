"""The official ``ollama`` client against a live server on the fake runtime."""

from __future__ import annotations

import httpx
import ollama
import pytest

from tests.hub.conftest import fake_hub  # noqa: F401
from tests.support.servers import wait_until


@pytest.fixture
def oll(live):
    return ollama.Client(host=live.url, timeout=20)


def test_version_tags_show(oll, live):
    assert httpx.get(f"{live.url}/api/version").json()["version"]
    tags = oll.list().models
    assert [m.model for m in tags] == ["tiny:latest"]  # Ollama tags untagged names :latest
    assert tags[0].details.family == "llama" and tags[0].details.format == "gguf"
    assert tags[0].size > 0
    shown = oll.show("tiny")
    assert "{%" in shown.template  # the tiny GGUF's Jinja chat template
    assert shown.details.quantization_level == "F32"
    assert shown.modelinfo["context_length"] == 256
    with pytest.raises(ollama.ResponseError) as info:
        oll.show("nope")
    assert info.value.status_code == 404 and "nope" in info.value.error


def test_chat_streaming_and_not(oll):
    messages = [{"role": "user", "content": "hello"}]
    whole = oll.chat(model="tiny", messages=messages, options={"temperature": 0, "num_predict": 8})
    assert whole.message.role == "assistant" and whole.message.content.startswith("You said: hello.")
    assert whole.done and whole.done_reason == "length"
    assert whole.eval_count == 8 and whole.prompt_eval_count > 0
    assert whole.total_duration >= whole.eval_duration >= 0
    parts = list(oll.chat(model="tiny", messages=messages, options={"temperature": 0, "num_predict": 8}, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    assert parts[-1].eval_count == 8


def test_generate_streaming_and_not(oll):
    r = oll.generate(model="tiny", prompt="tell me", options={"temperature": 0, "num_predict": 5})
    assert r.response.startswith("You said: tell me.") and r.done
    raw = oll.generate(model="tiny", prompt="a b c", raw=True, options={"temperature": 0, "num_predict": 5})
    assert raw.response.startswith(" ... a b c.")
    parts = list(
        oll.generate(model="tiny", prompt="tell me", options={"temperature": 0, "num_predict": 5}, stream=True)
    )
    assert "".join(p.response for p in parts) == r.response


def test_options_stop_seed(oll):
    r = oll.chat(model="tiny", messages=[{"role": "user", "content": "x"}], options={"stop": ["said"]})
    assert r.message.content == "You " and r.done_reason == "stop"
    a = oll.generate(model="tiny", prompt="p", options={"seed": 7, "temperature": 1.0, "num_predict": 20})
    b = oll.generate(model="tiny", prompt="p", options={"seed": 7, "temperature": 1.0, "num_predict": 20})
    assert a.response == b.response


def test_unsupported_options_and_fields_are_400(oll):
    for kwargs, name in (
        ({"format": "json"}, "format"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "description": "d",
                            "parameters": {"type": "object", "properties": {}},
                        },
                    }
                ]
            },
            "tools",
        ),
    ):
        with pytest.raises(ollama.ResponseError) as info:
            oll.chat(model="tiny", messages=[{"role": "user", "content": "x"}], **kwargs)
        assert info.value.status_code == 400 and name in info.value.error and "fake" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        oll.chat(model="tiny", messages=[{"role": "user", "content": "x"}], options={"num_ctx": 1_000_000})
    assert info.value.status_code == 400 and "num_ctx" in info.value.error
    ok = oll.chat(
        model="tiny", messages=[{"role": "user", "content": "x"}], options={"num_ctx": 1024, "num_predict": 2}
    )
    assert ok.eval_count == 2


def test_unknown_model_is_404(oll):
    with pytest.raises(ollama.ResponseError) as info:
        oll.chat(model="ghost", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 404 and "ghost" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        list(oll.generate(model="ghost", prompt="x", stream=True))
    assert info.value.status_code == 404


def test_embed_and_legacy_embeddings(oll):
    r = oll.embed(model="tiny", input=["a", "b"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 16
    one = oll.embed(model="tiny", input="a")
    assert one.embeddings[0] == r.embeddings[0]
    legacy = oll.embeddings(model="tiny", prompt="a")
    assert list(legacy.embedding) == r.embeddings[0]


def test_ps_and_keep_alive(oll, live):
    manager = live.stack.manager
    assert oll.ps().models == []
    oll.generate(model="tiny", prompt="x", options={"num_predict": 1}, keep_alive="10m")
    ps = oll.ps().models
    assert [m.model for m in ps] == ["tiny:latest"] and ps[0].context_length == 2048
    assert 590 <= manager.loaded()[0]["ttl_left_s"] <= 600
    oll.generate(model="tiny", prompt="x", options={"num_predict": 1}, keep_alive=-1)
    assert manager.loaded()[0]["ttl_left_s"] is None  # negative: never unloaded on idle
    assert oll.ps().models[0].expires_at.year > 2100
    oll.generate(model="tiny", prompt="x", options={"num_predict": 1}, keep_alive=90)
    assert 85 <= manager.loaded()[0]["ttl_left_s"] <= 90
    # 0: unloaded once the request is done
    oll.chat(model="tiny", messages=[{"role": "user", "content": "x"}], options={"num_predict": 1}, keep_alive=0)
    assert wait_until(lambda: manager.loaded() == [], 3)


def test_empty_prompt_loads_and_keep_alive_zero_unloads(oll, live):
    manager = live.stack.manager
    r = oll.generate(model="tiny")
    assert r.done_reason == "load" and [m["name"] for m in manager.loaded()] == ["tiny"]
    r = oll.generate(model="tiny", keep_alive=0)
    assert r.done_reason == "unload" and manager.loaded() == []
    r = oll.chat(model="tiny", messages=[], keep_alive="1h")
    assert r.done_reason == "load" and manager.loaded()[0]["ttl_left_s"] > 3500


def test_bad_keep_alive_is_400(oll):
    with pytest.raises(ollama.ResponseError) as info:
        oll.generate(model="tiny", prompt="x", keep_alive="soon")
    assert info.value.status_code == 400 and "keep_alive" in info.value.error


def test_delete(oll, live):
    oll.generate(model="tiny", prompt="x", options={"num_predict": 1})
    assert oll.delete("tiny").status == "success"
    assert oll.list().models == [] and live.stack.manager.loaded() == []
    with pytest.raises(ollama.ResponseError) as info:
        oll.delete("tiny")
    assert info.value.status_code == 404


@pytest.mark.usefixtures("fake_hub")
def test_pull_streams_progress_and_registers_the_model(oll):
    events = list(oll.pull("testorg/Tiny-GGUF", stream=True))
    statuses = [e.status for e in events]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    progress = [e for e in events if e.total]
    assert progress and progress[-1].completed == progress[-1].total
    assert "testorg/tiny-gguf:q4_k_m" in [m.model for m in oll.list().models]
    assert oll.pull("testorg/Tiny-GGUF:Q8_0").status == "success"


@pytest.mark.usefixtures("fake_hub")
def test_pull_failure_reaches_the_client(oll):
    with pytest.raises(ollama.ResponseError, match="nothing"):
        list(oll.pull("testorg/nothing-GGUF", stream=True))
    with pytest.raises(ollama.ResponseError, match="nothing"):
        oll.pull("testorg/nothing-GGUF")


def test_pull_unavailable_is_501(client, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "localrun.modelstore.pull", None)  # import fails
    r = client.post("/api/pull", json={"model": "a/b"})
    assert r.status_code == 501 and "pull" in r.json()["error"]
