"""The Ollama runtime against a real HTTP server on 127.0.0.1 that speaks Ollama's API.

Each behaviour of the fake server that the runtime relies on is first checked with the
official ``ollama`` client, so the fake cannot drift into something only localrun accepts.
"""

from __future__ import annotations

import functools
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import httpx
import ollama
import pytest

from localrun.errors import (
    DownloadFailed,
    LocalrunError,
    ModelNotFound,
    RuntimeUnavailable,
    UnsupportedFeature,
    WorkerCrashed,
)
from localrun.runtimes.ollama import OllamaRuntime, ollama_options
from localrun.runtimes.ollama_client import PullProgress, ollama_base_url
from localrun.types import Cancel, ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling, fold
from localrun.worker.host import InProcessHandle, iter_chunks
from tests.support.servers import free_port


def _record(name: str = "llama3.2", **metadata) -> ModelRecord:
    return ModelRecord(name=name, format=Format.GGUF, path="", metadata=metadata)


def _plan(**options) -> Plan:
    return Plan(runtime="ollama", n_ctx=1024, options=options)


def _bodies(server, path):
    return [body for p, body in server.state.requests if p == path]


@pytest.mark.parametrize(
    "raw,url",
    [
        (None, "http://127.0.0.1:11434"),
        ("", "http://127.0.0.1:11434"),
        ("1.2.3.4", "http://1.2.3.4:11434"),
        (":56789", "http://127.0.0.1:56789"),
        ("example.com:56789", "http://example.com:56789"),
        ("http://example.com", "http://example.com:80"),
        ("https://example.com", "https://example.com:443"),
        ("https://example.com:8443/ollama/", "https://example.com:8443/ollama"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("0.0.0.0:1234", "http://127.0.0.1:1234"),
        ("[::1]:9999", "http://[::1]:9999"),
    ],
)
def test_ollama_host_is_read_like_ollama_reads_it(monkeypatch, raw, url):
    if raw is None:
        monkeypatch.delenv("OLLAMA_HOST", raising=False)
    else:
        monkeypatch.setenv("OLLAMA_HOST", raw)
    assert ollama_base_url() == url


def test_sampling_maps_to_ollama_options():
    s = Sampling(
        temperature=0.3, top_p=0.9, top_k=20, min_p=0.1, repeat_penalty=1.2, seed=5, stop=("\n",), max_tokens=7
    )
    assert ollama_options(s, n_ctx=4096) == {
        "temperature": 0.3,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.1,
        "repeat_penalty": 1.2,
        "num_ctx": 4096,
        "seed": 5,
        "stop": ["\n"],
        "num_predict": 7,
    }
    assert "seed" not in ollama_options(Sampling(), n_ctx=None) and "num_ctx" not in ollama_options(
        Sampling(), n_ctx=None
    )


def test_fake_server_speaks_the_api_the_official_client_expects(fake_ollama):
    client = ollama.Client(host=fake_ollama.url)
    assert [m.model for m in client.list().models] == ["llama3.2:latest", "nomic-embed-text:latest"]
    assert client.show("llama3.2").capabilities == ["completion"]
    parts = [
        p.message.content
        for p in client.chat(
            model="llama3.2", messages=[{"role": "user", "content": "hi"}], stream=True, options={"num_predict": 4}
        )
    ]
    assert len([p for p in parts if p]) == 4
    answer = client.generate(model="llama3.2", prompt="hi", options={"num_predict": 3, "seed": 1})
    assert answer.done and answer.done_reason == "length" and answer.eval_count == 3
    assert len(client.embed(model="nomic-embed-text", input=["a", "b"]).embeddings) == 2
    assert [p.status for p in client.pull("tinyllama", stream=True)][-1] == "success"
    assert client.ps().models  # chat above loaded llama3.2
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="missing", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 404


def test_probe_reports_version_and_models(fake_ollama):
    status = OllamaRuntime(host=fake_ollama.url).probe()
    assert status.available and status.version == httpx.get(f"{fake_ollama.url}/api/version").json()["version"]
    assert status.details["models"] == ["llama3.2:latest", "nomic-embed-text:latest"]


def test_probe_and_load_when_ollama_is_down_say_how_to_start_it():
    url = f"http://127.0.0.1:{free_port()}"
    status = OllamaRuntime(host=url).probe()
    assert not status.available and url in status.reason and status.fix == "ollama serve"
    with pytest.raises(RuntimeUnavailable) as info:
        OllamaRuntime(host=url).load(_record(), _plan())
    assert f"no Ollama server at {url}" in info.value.message
    assert "ollama serve" in info.value.hint and "OLLAMA_HOST" in info.value.hint


def test_probe_of_something_that_is_not_ollama(tmp_path):
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status = OllamaRuntime(host=f"127.0.0.1:{server.server_address[1]}").probe()
    finally:
        server.shutdown()
        server.server_close()
    assert not status.available and "an Ollama server?" in status.reason


def test_probe_uses_ollama_host_from_the_environment(fake_ollama, monkeypatch):
    monkeypatch.setenv("OLLAMA_HOST", fake_ollama.url.removeprefix("http://"))
    assert OllamaRuntime().probe().available


def test_list_models(fake_ollama):
    models = OllamaRuntime(host=fake_ollama.url).list_models()
    assert [m.name for m in models] == ["llama3.2:latest", "nomic-embed-text:latest"]
    assert models[0].family == "llama" and models[0].quantization_level == "Q4_K_M" and models[0].size == 1000


def test_unknown_model_is_model_not_found_with_the_pull_command(fake_ollama):
    with pytest.raises(ModelNotFound) as info:
        OllamaRuntime(host=fake_ollama.url).load(_record("qwen9:latest"), _plan())
    assert info.value.hint == "run `ollama pull qwen9:latest`"


def test_model_name_comes_from_metadata_then_repo_then_name(fake_ollama):
    rt = OllamaRuntime(host=fake_ollama.url)
    rt.load(_record("local-alias", ollama_name="llama3.2"), _plan()).close()
    rt.load(ModelRecord(name="alias", format=Format.GGUF, path="", repo="llama3.2"), _plan()).close()
    assert [b["model"] for b in _bodies(fake_ollama, "/api/show")] == ["llama3.2", "llama3.2"]


def test_load_preloads_with_the_context_and_close_unloads(fake_ollama):
    session = OllamaRuntime(host=fake_ollama.url).load(_record(), _plan(keep_alive="10m"))
    preload = _bodies(fake_ollama, "/api/generate")[0]
    assert preload == {"model": "llama3.2", "stream": False, "keep_alive": "10m", "options": {"num_ctx": 1024}}
    assert "llama3.2:latest" in fake_ollama.state.loaded
    session.close()
    assert "llama3.2:latest" not in fake_ollama.state.loaded


def test_close_leaves_a_model_the_user_had_loaded(fake_ollama):
    ollama.Client(host=fake_ollama.url).generate(model="llama3.2", prompt="", keep_alive="1h")
    OllamaRuntime(host=fake_ollama.url).load(_record(), _plan()).close()
    assert "llama3.2:latest" in fake_ollama.state.loaded


def test_chat_sends_messages_options_and_keep_alive(fake_ollama):
    session = OllamaRuntime(host=fake_ollama.url).load(_record(), _plan())
    req = ChatRequest(
        messages=(Message("system", "be brief"), Message("user", "hi")),
        sampling=Sampling(temperature=0.2, seed=9, max_tokens=6, stop=("zzz",)),
    )
    text, finish, usage = fold(session.chat(req, Cancel()))
    body = _bodies(fake_ollama, "/api/chat")[-1]
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert body["options"]["num_ctx"] == 1024 and body["options"]["num_predict"] == 6
    assert body["options"]["seed"] == 9 and body["options"]["stop"] == ["zzz"] and body["keep_alive"] == "30m"
    official = ollama.Client(host=fake_ollama.url).chat(
        model="llama3.2", messages=body["messages"], options=body["options"]
    )
    assert text == official.message.content
    assert finish == "length" and usage.completion_tokens == 6 and usage.prompt_tokens == official.prompt_eval_count


def test_completion_is_raw(fake_ollama):
    session = OllamaRuntime(host=fake_ollama.url).load(_record(), _plan())
    text, finish, _ = fold(session.complete(CompletionRequest("once upon", Sampling(max_tokens=3)), Cancel()))
    body = _bodies(fake_ollama, "/api/generate")[-1]
    assert body["raw"] is True and body["prompt"] == "once upon"
    assert len(text.split()) == 3 and finish == "length"


def test_embeddings(fake_ollama):
    session = OllamaRuntime(host=fake_ollama.url).load(_record("nomic-embed-text"), _plan())
    assert "embeddings" in session.capabilities
    assert _bodies(fake_ollama, "/api/generate") == []  # an embedding model cannot be preloaded by generate
    with pytest.raises(UnsupportedFeature, match="does not support chat"):
        list(session.chat(ChatRequest(messages=(Message("user", "hi"),)), Cancel()))
    vectors = session.embed(["a", "b", "a"])
    assert len(vectors) == 3 and vectors[0] == vectors[2] != vectors[1]
    chat_only = OllamaRuntime(host=fake_ollama.url).load(_record(), _plan())
    assert "embeddings" not in chat_only.capabilities
    with pytest.raises(UnsupportedFeature, match="does not support embeddings"):
        chat_only.embed(["a"])


def test_cancel_closes_the_stream_and_ollama_stops(fake_ollama):
    fake_ollama.state.token_delay_s = 0.3
    session = OllamaRuntime(host=fake_ollama.url).load(_record(), _plan())
    cancel = Cancel()
    stream = session.chat(ChatRequest(messages=(Message("user", "hi"),)), cancel)
    first = next(stream)
    cancel.set()
    started = time.monotonic()
    rest = list(stream)
    elapsed = time.monotonic() - started
    assert first.text and [c.finish_reason for c in rest] == ["cancelled"]
    assert elapsed < 0.25, f"cancel took {elapsed:.2f} s with 0.3 s between tokens"
    deadline = time.monotonic() + 2
    while not fake_ollama.state.disconnects and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake_ollama.state.disconnects == ["llama3.2"]


def test_an_error_line_mid_stream_becomes_an_error_with_ollamas_words(fake_ollama, monkeypatch):
    from tests.runtimes import fake_ollama as module

    def failing(self, body, prompt, *, chat, empty):
        self._start_stream()
        self._line({"model": body["model"], "message": {"role": "assistant", "content": "one"}, "done": False})
        self._line({"error": "llama runner process has terminated: signal: killed"})
        self._end_stream()

    session = OllamaRuntime(host=fake_ollama.url).load(_record(), _plan())
    monkeypatch.setattr(module._Handler, "_run", failing)
    with pytest.raises(LocalrunError, match="llama runner process has terminated"):
        list(session.chat(ChatRequest(messages=(Message("user", "hi"),)), Cancel()))


def test_a_stream_cut_mid_answer_is_a_crash_not_an_end(fake_ollama, monkeypatch):
    from tests.runtimes import fake_ollama as module

    def cut(self, body, prompt, *, chat, empty):
        self._start_stream()
        self._line({"model": body["model"], "message": {"role": "assistant", "content": "one"}, "done": False})
        self.close_connection = True  # no final chunk: the server went away mid-answer

    session = OllamaRuntime(host=fake_ollama.url).load(_record(), _plan())
    monkeypatch.setattr(module._Handler, "_run", cut)
    with pytest.raises(WorkerCrashed, match="broke off"):
        list(session.chat(ChatRequest(messages=(Message("user", "hi"),)), Cancel()))


def test_pull_reports_progress_and_registers_the_model(fake_ollama):
    seen: list[PullProgress] = []
    OllamaRuntime(host=fake_ollama.url).pull("tinyllama", seen.append)
    assert seen[0].status == "pulling manifest" and seen[-1].status == "success"
    fractions = [p.fraction for p in seen if p.fraction is not None]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert "tinyllama:latest" in [m.name for m in OllamaRuntime(host=fake_ollama.url).list_models()]


def test_pull_of_an_unknown_model(fake_ollama):
    with pytest.raises(ModelNotFound, match="no model 'nosuch'"):
        OllamaRuntime(host=fake_ollama.url).pull("nosuch")


def test_pull_that_ends_early_is_a_download_failure(fake_ollama, monkeypatch):
    from tests.runtimes import fake_ollama as module

    def cut(self, body):
        self._start_stream()
        self._line({"status": "pulling manifest"})
        self._end_stream()

    monkeypatch.setattr(module._Handler, "_pull", cut)
    with pytest.raises(DownloadFailed, match="ended before it succeeded"):
        OllamaRuntime(host=fake_ollama.url).pull("tinyllama")


def test_through_the_in_process_handle_two_streams_run_at_once(fake_ollama):
    fake_ollama.state.token_delay_s = 0.1
    session = OllamaRuntime(host=fake_ollama.url).load(_record(), _plan())
    assert session.concurrent
    handle = InProcessHandle(_record(), _plan(), session)
    req = ChatRequest(messages=(Message("user", "hi"),), sampling=Sampling(max_tokens=8))
    a = iter_chunks(handle, req)
    b = iter_chunks(handle, req)
    first_a = next(a)
    started = time.monotonic()
    first_b = next(b)
    waited = time.monotonic() - started  # one after the other would wait for all of a: 0.8 s
    results = [fold([first_a, *a]), fold([first_b, *b])]
    handle.close()
    assert results[0] == results[1] and results[0][1] == "length"
    assert waited < 0.4, f"the second stream waited {waited:.2f} s for the first"
