"""The Ollama wire as the apps people use it (issue 21): digests, ``:latest`` names, lenient
options, capabilities in /api/show, pull, copy, create and embed ``dimensions``, on the fake
runtime through the app in-process."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest

from localrun.server.fields import HEADER

HEX64 = re.compile(r"^[0-9a-f]{64}$")
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}


def _register(stack, name: str, **meta):
    """Another registration of the tiny GGUF, with these metadata overrides."""
    base = stack.store.resolve("tiny")
    record = dataclasses.replace(base, name=name, metadata={**base.metadata, **meta})
    return stack.store.register(record)


def _tags(client) -> dict[str, dict]:
    r = client.get("/api/tags")
    assert r.status_code == 200
    return {m["model"]: m for m in r.json()["models"]}


def _ignored(r) -> set[str]:
    return {n.strip() for n in r.headers.get(HEADER, "").split(",") if n.strip()}


# --- digest ------------------------------------------------------------------------------


def test_each_registration_has_a_stable_distinct_digest(stack, client, tiny_fim):
    stack.store.import_path(tiny_fim, name="fim")
    _register(stack, "tiny-mean", **{"localrun.pooling": "mean"})
    _register(stack, "tiny-cls", **{"localrun.pooling": "cls"})
    tags = _tags(client)
    digests = {name: m["digest"] for name, m in tags.items()}
    assert set(digests) == {"tiny:latest", "fim:latest", "tiny-mean:latest", "tiny-cls:latest"}
    assert all(HEX64.match(d) for d in digests.values()), digests
    # One file, two poolings: two models (llm-ollama groups names by digest).
    assert len(set(digests.values())) == 4
    assert {n: m["digest"] for n, m in _tags(client).items()} == digests  # stable
    client.post("/api/generate", json={"model": "tiny", "prompt": "x", "stream": False, "options": {"num_predict": 1}})
    ps = client.get("/api/ps").json()["models"]
    assert [(m["model"], m["digest"]) for m in ps] == [("tiny:latest", digests["tiny:latest"])]


def test_digest_follows_the_file_content_once_known(stack, client):
    before = _tags(client)["tiny:latest"]["digest"]
    stack.store.verify("tiny")  # records the sha256: the digest now names the content
    after = _tags(client)["tiny:latest"]["digest"]
    assert HEX64.match(after) and after != before
    # A copy of the same registration is the same model, as an Ollama copy shares the manifest.
    assert client.post("/api/copy", json={"source": "tiny", "destination": "twin"}).status_code == 200
    assert _tags(client)["twin:latest"]["digest"] == after


# --- names -------------------------------------------------------------------------------


def test_latest_names_resolve(client):
    r = client.post("/api/chat", json={**CHAT, "model": "tiny:latest", "options": {"num_predict": 2}})
    assert r.status_code == 200 and r.json()["done"]
    assert client.post("/api/show", json={"model": "TINY:latest"}).status_code == 200
    assert client.post("/api/show", json={"model": "tiny:other"}).status_code == 404


# --- options -----------------------------------------------------------------------------


def test_unknown_and_load_time_options_are_ignored_and_named(client):
    options = {
        "num_predict": 2,
        "draft_num_predict": 4,  # Ollama's own docs example
        "num_thread": 2,
        "num_gpu": 0,
        "num_batch": 8,
        "use_mmap": True,
        "use_mlock": False,
        "numa": False,
        "low_vram": False,
        "main_gpu": 0,
        "num_keep": 4,
        "repeat_last_n": 33,
        "mirostat": 2,
        "mirostat_eta": 0.1,
        "mirostat_tau": 5.0,
        "tfs_z": 0.9,
        "penalize_newline": True,
        "presence_penalty": 0.5,  # the fake runtime, as configured here, has no penalties
    }
    r = client.post("/api/chat", json={**CHAT, "options": options})
    assert r.status_code == 200, r.text
    assert r.json()["eval_count"] == 2  # the honoured option still acts
    named = _ignored(r)
    assert {f"options.{k}" for k in options if k != "num_predict"} == named
    r = client.post("/api/generate", json={"model": "tiny", "prompt": "p", "stream": False, "options": options})
    assert r.status_code == 200 and "options.draft_num_predict" in _ignored(r)
    r = client.post("/api/embed", json={"model": "tiny", "input": "a", "options": {"num_thread": 1, "zzz": 1}})
    assert r.status_code == 200 and _ignored(r) == {"options.num_thread", "options.zzz"}


def test_no_op_option_values_are_not_reported(client):
    options = {"num_predict": 1, "mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0, "repeat_last_n": 64}
    r = client.post("/api/chat", json={**CHAT, "options": options})
    assert r.status_code == 200 and HEADER not in r.headers


def test_penalties_are_honoured_where_the_runtime_has_them(app_client):
    client = app_client(capabilities=["presence_penalty", "frequency_penalty", "typical_p"])
    options = {"num_predict": 1, "presence_penalty": 0.5, "frequency_penalty": 0.2, "typical_p": 0.9}
    r = client.post("/api/chat", json={**CHAT, "options": options})
    assert r.status_code == 200 and HEADER not in r.headers


def test_strict_fields_refuse_an_unknown_option(app_client):
    client = app_client(strict_fields=True)
    r = client.post("/api/chat", json={**CHAT, "options": {"draft_num_predict": 1}})
    assert r.status_code == 400 and "draft_num_predict" in r.json()["error"]


# --- /api/show ---------------------------------------------------------------------------


def _show(client, name: str) -> dict:
    r = client.post("/api/show", json={"model": name})
    assert r.status_code == 200, r.text
    return r.json()


def test_show_capabilities_come_from_the_model(stack, client, tiny_fim):
    assert _show(client, "tiny")["capabilities"] == ["completion"]
    _register(stack, "tiny-mean", **{"localrun.pooling": "mean"})
    assert _show(client, "tiny-mean")["capabilities"] == ["completion", "embedding"]
    stack.store.import_path(tiny_fim, name="fim")
    assert "insert" in _show(client, "fim")["capabilities"]
    tools = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    _register(stack, "tiny-tools", **{"localrun.chat_template": tools})
    assert _show(client, "tiny-tools")["capabilities"] == ["completion", "tools"]
    think = "{% for m in messages %}{{ m['content'] }}{% endfor %}<think>"
    _register(stack, "tiny-think", **{"localrun.chat_template": think, "localrun.projector": "/x/mmproj.gguf"})
    assert _show(client, "tiny-think")["capabilities"] == ["completion", "vision", "thinking"]


def test_show_capabilities_of_an_embedding_gguf(stack, client, tmp_path):
    from tests.factories import write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "embedder.gguf", extra_kv={"llama.pooling_type": 1})
    stack.store.import_path(path, name="embedder")
    assert _show(client, "embedder")["capabilities"] == ["embedding"]


def test_show_model_info_has_the_gguf_keys(client):
    info = _show(client, "tiny")["model_info"]
    assert info["general.architecture"] == "llama"
    assert info["llama.context_length"] == 256 and info["llama.embedding_length"] == 64
    assert info["general.parameter_count"] > 0
    assert info["context_length"] == 256  # localrun's own flat name stays for its older clients


# --- pull --------------------------------------------------------------------------------


def test_pull_of_a_registered_model_succeeds_and_insecure_is_accepted(client):
    r = client.post("/api/pull", json={"model": "tiny", "insecure": True, "stream": False})
    assert r.status_code == 200 and r.json() == {"status": "success"}
    r = client.post("/api/pull", json={"model": "tiny:latest", "insecure": True})
    assert r.status_code == 200
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert lines[0]["status"] == "pulling manifest" and lines[-1] == {"status": "success"}


# --- copy and create ---------------------------------------------------------------------


def test_copy_registers_a_real_model(stack, client, tiny_fim):
    assert client.post("/api/copy", json={"source": "tiny:latest", "destination": "mine:latest"}).status_code == 200
    assert stack.store.index.find("mine").path == stack.store.resolve("tiny").path
    assert "mine:latest" in _tags(client)
    r = client.post("/api/chat", json={**CHAT, "model": "mine", "options": {"num_predict": 1}})
    assert r.status_code == 200
    assert client.post("/api/copy", json={"source": "ghost", "destination": "x"}).status_code == 404
    # Another model's name is not overwritten (its files could be orphaned); the same files' is.
    stack.store.import_path(tiny_fim, name="fim")
    r = client.post("/api/copy", json={"source": "fim", "destination": "mine"})
    assert r.status_code == 409 and "mine" in r.json()["error"]
    assert client.post("/api/create", json={"model": "mine", "from": "tiny", "system": "s"}).status_code == 200
    assert client.request("DELETE", "/api/delete", json={"model": "mine"}).status_code == 200
    assert stack.store.resolve("tiny")  # the source and its file are untouched


def test_create_from_a_model_with_system_and_parameters(stack, client):
    body = {"model": "mario", "from": "tiny", "system": "You are Mario from Super Mario Bros.", "stream": False}
    body["parameters"] = {"num_predict": 3, "stop": ["zzz"]}
    r = client.post("/api/create", json=body)
    assert r.status_code == 200 and r.json() == {"status": "success"}
    shown = _show(client, "mario")
    assert shown["system"] == body["system"] and "num_predict" in shown["parameters"]
    assert _tags(client)["mario:latest"]["digest"] != _tags(client)["tiny:latest"]["digest"]
    plain = client.post("/api/chat", json={**CHAT, "options": {"num_predict": 3}}).json()
    mario = client.post("/api/chat", json={**CHAT, "model": "mario"}).json()
    assert mario["eval_count"] == 3  # the stored num_predict
    assert mario["prompt_eval_count"] > plain["prompt_eval_count"]  # the stored system prompt
    own = client.post("/api/chat", json={**CHAT, "model": "mario", "options": {"num_predict": 1}}).json()
    assert own["eval_count"] == 1  # the request's option wins


def test_create_streams_and_refuses_what_it_cannot_do(stack, client):
    r = client.post("/api/create", json={"model": "m2", "from": "tiny"})
    assert r.status_code == 200 and r.text.splitlines()[-1] == '{"status":"success"}'
    for body, field in (
        ({"model": "q", "from": "tiny", "quantize": "q4_K_M"}, "quantize"),
        ({"model": "q", "from": "tiny", "template": "{{ .Prompt }}"}, "template"),
        ({"model": "q", "from": "tiny", "parameters": {"no_such": 1}}, "no_such"),
        ({"model": "q", "files": {"m.gguf": "sha256:" + "0" * 64}}, "files"),
        ({"model": "q"}, "from"),
        ({"model": "q", "modelfile": "FROM tiny"}, "modelfile"),
    ):
        r = client.post("/api/create", json=body)
        assert r.status_code == 400 and field in r.text, (body, r.text)
    assert stack.store.index.find("q") is None


def test_create_from_files_already_in_the_store(stack, client):
    record = stack.store.verify("tiny")
    ref = "sha256:" + record.files[0].sha256
    assert client.head(f"/api/blobs/{ref}").status_code == 200
    assert client.head("/api/blobs/sha256:" + "1" * 64).status_code == 404
    r = client.post("/api/create", json={"model": "again", "files": {"tiny.gguf": ref}, "stream": False})
    assert r.status_code == 200, r.text
    assert stack.store.index.find("again").path == record.path


# --- embed -------------------------------------------------------------------------------


def test_embed_dimensions_truncate_and_renormalize(client):
    full = client.post("/api/embed", json={"model": "tiny", "input": ["a", "b"]}).json()["embeddings"]
    r = client.post("/api/embed", json={"model": "tiny", "input": ["a", "b"], "dimensions": 4})
    assert r.status_code == 200, r.text
    for short, long in zip(r.json()["embeddings"], full):
        assert len(short) == 4
        assert math.isclose(math.sqrt(sum(x * x for x in short)), 1.0, rel_tol=1e-6)
        scale = short[0] / long[0]
        assert all(math.isclose(s, v * scale, rel_tol=1e-6) for s, v in zip(short, long[:4]))
    same = client.post("/api/embed", json={"model": "tiny", "input": ["a"], "dimensions": 4096}).json()
    assert same["embeddings"][0] == full[0]  # no longer than asked: as it is


@pytest.mark.parametrize("route", ["/api/generate", "/api/chat"])
def test_no_context_where_the_runtime_cannot_tokenize(client, route):
    body = {"model": "tiny", "stream": False, "options": {"num_predict": 1}}
    body.update({"prompt": "x"} if route == "/api/generate" else {"messages": CHAT["messages"]})
    assert "context" not in client.post(route, json=body).json()
    if route == "/api/generate":
        r = client.post(route, json={**body, "context": [1, 2, 3]})
        assert r.status_code == 400 and "context" in r.json()["error"]
