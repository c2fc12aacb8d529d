"""The MLX runtime on a tiny random-weight mlx-lm model, on the CPU: probing, refusing
folders that ship code, chat templates through localrun's sandbox, the prefix cache,
context limits, cancellation in prefill, and a real worker process end to end."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

import pytest

from localrun.errors import ContextOverflow, InvalidModelFile, ModelNotFound, TemplateError, UnsupportedFeature
from localrun.types import Cancel, ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling, fold
from tests.runtimes.conftest import needs_mlx

pytestmark = needs_mlx

GREEDY = Sampling(temperature=0.0, max_tokens=10)


def _record(path: Path, name: str = "tiny-mlx") -> ModelRecord:
    return ModelRecord(name=name, format=Format.MLX, path=str(path))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _load(path: Path, **options):
    from localrun.runtimes.mlx import MlxRuntime

    return MlxRuntime().load(_record(path), Plan(runtime="mlx", n_ctx=256, options=options))


def _chat(text: str = "hello") -> ChatRequest:
    return ChatRequest(messages=(Message("user", text),), sampling=GREEDY)


def test_probe_reports_mlx_and_its_device():
    from localrun.runtimes.mlx import MlxRuntime

    status = MlxRuntime().probe()
    assert status.available and status.name == "mlx"
    assert status.version and status.devices[0] in ("cpu", "metal", "gpu")
    assert "device" in status.details


def test_probe_without_mlx_gives_the_install_command(monkeypatch):
    from localrun.runtimes.mlx import MlxRuntime

    monkeypatch.setitem(sys.modules, "mlx", None)
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    status = MlxRuntime().probe()
    assert not status.available and status.reason == "mlx is not installed"
    assert status.fix == "pip install 'localrun[mlx]'"


def test_probe_without_mlx_lm(monkeypatch):
    import importlib.util

    from localrun.runtimes.mlx import MlxRuntime

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlx_lm" else real(name, *a))
    status = MlxRuntime().probe()
    assert not status.available and "mlx-lm is not" in status.reason


@pytest.mark.parametrize(
    "where,key,value",
    [
        ("config.json", "model_file", "evil.json"),
        ("config.json", "auto_map", {"AutoModelForCausalLM": "evil.Model"}),
        ("tokenizer_config.json", "auto_map", {"AutoTokenizer": ["evil.Tok", None]}),
        ("tokenizer_config.json", "chat_template_type", "../../etc"),
    ],
)
def test_folders_that_ask_to_run_code_are_refused(tiny_mlx_dir, tmp_path, where, key, value):
    folder = _copy(tiny_mlx_dir, tmp_path / "m")
    data = json.loads((folder / where).read_text())
    data[key] = value
    (folder / where).write_text(json.dumps(data))
    with pytest.raises(InvalidModelFile, match=key):
        _load(folder)


@pytest.mark.parametrize("name", ["evil.py", "sub/helper.py", "pytorch_model.bin", "weights.pkl"])
def test_code_and_pickle_files_are_refused_and_never_run(tiny_mlx_dir, tmp_path, name):
    folder = _copy(tiny_mlx_dir, tmp_path / "m")
    sentinel = tmp_path / "ran"
    target = folder / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"open({str(sentinel)!r}, 'w').write('x')\n")
    config = json.loads((folder / "config.json").read_text())
    if name == "evil.py":  # the mlx-lm CVE-2026-5843 shape: config names the file to import
        config["model_file"] = "evil.py"
        (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidModelFile) as info:
        _load(folder)
    assert info.value.hint and "trust" in info.value.hint
    assert not sentinel.exists()


def test_missing_folder_is_model_not_found_and_nothing_is_downloaded(tmp_path):
    with pytest.raises(ModelNotFound, match="no MLX model folder"):
        _load(tmp_path / "mlx-community" / "nothing-here")


def test_folder_without_weights_is_invalid(tiny_mlx_dir, tmp_path):
    folder = _copy(tiny_mlx_dir, tmp_path / "m")
    for f in folder.glob("model*.safetensors"):
        f.unlink()
    with pytest.raises(InvalidModelFile, match="safetensors"):
        _load(folder)


def test_chat_prompt_comes_from_the_tokenizer_template(tiny_mlx_session):
    tok = tiny_mlx_session._tokenizer
    ids, stops = tiny_mlx_session.chat_prompt([Message("system", "be brief"), Message("user", "hi")])
    assert stops == ()
    text = tok.decode(ids)
    assert text.startswith("<s>")
    assert "<|system|>" in text and "<|user|>" in text and text.rstrip().endswith("<|assistant|>")


def test_a_malicious_template_is_rendered_in_the_sandbox(tiny_mlx_dir, tmp_path):
    folder = _copy(tiny_mlx_dir, tmp_path / "m")
    sentinel = tmp_path / "pwned"
    payload = f"{{{{ self.__init__.__globals__.__builtins__.__import__('os').system('touch {sentinel}') }}"
    (folder / "chat_template.jinja").write_text(payload)
    session = _load(folder)
    with pytest.raises(TemplateError):
        list(session.chat(_chat(), Cancel()))
    assert not sentinel.exists()


def test_a_model_without_template_gets_the_plain_transcript(tiny_mlx_dir, tmp_path):
    folder = _copy(tiny_mlx_dir, tmp_path / "m")
    (folder / "chat_template.jinja").unlink()
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    tok_config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    session = _load(folder)
    ids, stops = session.chat_prompt([Message("user", "hi")])
    assert "User:" in stops and "Assistant:" in stops
    assert session._tokenizer.decode(ids).endswith("User: hi\nAssistant:")
    text, finish, usage = fold(session.chat(_chat("hi"), Cancel()))
    assert finish in ("stop", "length") and usage.completion_tokens > 0


def test_chat_streams_tokens_and_ends_with_usage(tiny_mlx_session):
    chunks = list(tiny_mlx_session.chat(_chat(), Cancel()))
    text, finish, usage = fold(chunks)
    assert finish == "length" and usage.completion_tokens == 10
    prompt_ids, _ = tiny_mlx_session.chat_prompt([Message("user", "hello")])
    assert usage.prompt_tokens == len(prompt_ids)
    assert len([c for c in chunks if c.text]) >= 5 and text.strip()


def test_the_next_turn_reuses_the_cached_prefix_and_decodes_the_same(tiny_mlx_dir):
    warm = _load(tiny_mlx_dir)
    first = fold(warm.chat(_chat(), Cancel()))
    turn2 = ChatRequest(
        messages=(Message("user", "hello"), Message("assistant", first[0]), Message("user", "more")), sampling=GREEDY
    )
    warm_answer = fold(warm.chat(turn2, Cancel()))
    cold_answer = fold(_load(tiny_mlx_dir).chat(turn2, Cancel()))
    assert warm_answer[2].cached_tokens > 10 and cold_answer[2].cached_tokens == 0
    assert warm_answer[0] == cold_answer[0]


def test_same_seed_same_sample(tiny_mlx_session):
    req = CompletionRequest(
        "the quick", Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11, max_tokens=12)
    )
    a = fold(tiny_mlx_session.complete(req, Cancel()))[0]
    b = fold(tiny_mlx_session.complete(req, Cancel()))[0]
    c = fold(
        tiny_mlx_session.complete(
            CompletionRequest(
                "the quick", Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=12, max_tokens=12)
            ),
            Cancel(),
        )
    )[0]
    assert a == b
    assert a != c


def test_repeat_penalty_changes_a_looping_greedy_answer(tiny_mlx_session):
    base = CompletionRequest("hello world", Sampling(temperature=0.0, max_tokens=40))
    penalised = CompletionRequest("hello world", Sampling(temperature=0.0, max_tokens=40, repeat_penalty=5.0))
    assert fold(tiny_mlx_session.complete(base, Cancel()))[0] != fold(tiny_mlx_session.complete(penalised, Cancel()))[0]


def test_prompt_longer_than_the_context_is_refused_before_any_chunk(tiny_mlx_session):
    with pytest.raises(ContextOverflow, match="256-token context"):
        tiny_mlx_session.complete(CompletionRequest("hello world " * 200, GREEDY), Cancel())


def test_generation_stops_at_the_context_end(tiny_mlx_session):
    prompt = "hello world " * 60
    n_prompt = len(tiny_mlx_session._tokenizer.encode(prompt))
    _, finish, usage = fold(tiny_mlx_session.complete(CompletionRequest(prompt, Sampling(temperature=0.0)), Cancel()))
    assert finish == "length"
    assert usage.prompt_tokens + usage.completion_tokens == 256 and usage.prompt_tokens == n_prompt


def test_cancel_during_prefill_stops_before_the_first_token(tiny_mlx_dir):
    from localrun.runtimes.mlx import MlxRuntime

    session = MlxRuntime().load(_record(tiny_mlx_dir), Plan(runtime="mlx", n_ctx=512, n_batch=16))
    cancel = Cancel()
    seen = []
    real = session._take_cache

    def take(prompt):
        cache, reused = real(prompt)
        cancel.set()  # as if the client left while the prompt is being read
        return cache, reused

    session._take_cache = take
    chunks = list(session.complete(CompletionRequest("hello world " * 30, GREEDY), cancel))
    seen.extend(chunks)
    assert [c.finish_reason for c in seen] == ["cancelled"]
    assert seen[0].usage.completion_tokens == 0
    session._take_cache = real
    # The session is still usable and the partial cache did not poison the next answer.
    again = fold(session.complete(CompletionRequest("hello world " * 30, GREEDY), Cancel()))
    fresh = fold(_load(tiny_mlx_dir).complete(CompletionRequest("hello world " * 30, GREEDY), Cancel()))
    assert again[0] == fresh[0]


def test_max_tokens_zero_returns_no_text(tiny_mlx_session):
    chunks = list(tiny_mlx_session.complete(CompletionRequest("hi", Sampling(max_tokens=0)), Cancel()))
    assert [(c.text, c.finish_reason) for c in chunks] == [("", "length")]


def test_embeddings_are_unsupported_by_name(tiny_mlx_session):
    with pytest.raises(UnsupportedFeature, match="MLX"):
        tiny_mlx_session.embed(["x"])


def test_a_real_worker_process_runs_mlx_and_cancels(tiny_mlx_dir, tmp_path):
    """The production path: the model loads in ``python -m localrun.worker``."""
    from localrun.worker.host import WorkerHandle, iter_chunks

    handle = WorkerHandle(_record(tiny_mlx_dir), Plan(runtime="mlx", n_ctx=256), log_path=tmp_path / "w.log")
    try:
        text, finish, usage = fold(iter_chunks(handle, _chat()))
        assert finish == "length" and usage.completion_tokens == 10 and text
        cancel = Cancel()
        long = ChatRequest(messages=(Message("user", "hello"),), sampling=Sampling(temperature=0.0))
        got = []
        for chunk in iter_chunks(handle, long, cancel):
            got.append(chunk)
            if len(got) == 3:
                threading.Timer(0.0, cancel.set).start()
        assert got[-1].finish_reason == "cancelled"
        assert got[-1].usage.completion_tokens < 200
    finally:
        handle.close()
    assert handle.proc.returncode == 0
