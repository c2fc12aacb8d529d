"""One contract, three runtimes: MLX (tiny random model, in process), Ollama (fake server
on 127.0.0.1) and MLC (``mlc_llm serve`` stand-in subprocess) must stream the same way,
end the same way and fail the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from localrun.errors import ModelNotFound
from localrun.runtimes.base import Session
from localrun.types import Cancel, ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling, fold
from tests.runtimes.conftest import mlc_plan, mlx_available
from tests.runtimes.fake_ollama import FakeModel, FakeOllama


@dataclass
class Harness:
    session: Any
    load_unknown: Callable[[], Any]


def _mlx(request, tmp_path):
    if not mlx_available():
        pytest.skip("mlx / mlx-lm are not installed")
    from localrun.runtimes.mlx import MlxRuntime

    folder = request.getfixturevalue("tiny_mlx_dir")
    plan = Plan(runtime="mlx", n_ctx=512)
    session = MlxRuntime().load(ModelRecord(name="tiny", format=Format.MLX, path=str(folder)), plan)
    missing = ModelRecord(name="gone", format=Format.MLX, path=str(tmp_path / "gone"))
    yield Harness(session, lambda: MlxRuntime().load(missing, plan))
    session.close()


def _ollama(request, tmp_path):
    from localrun.runtimes.ollama import OllamaRuntime

    with FakeOllama([FakeModel("llama3.2:latest")]) as server:
        rt = OllamaRuntime(host=server.url)
        plan = Plan(runtime="ollama", n_ctx=512)
        session = rt.load(ModelRecord(name="llama3.2", format=Format.GGUF, path=""), plan)
        yield Harness(session, lambda: rt.load(ModelRecord(name="gone", format=Format.GGUF, path=""), plan))
        session.close()
    assert server.state.errors == []


def _mlc(request, tmp_path):
    from localrun.runtimes.mlc import MlcRuntime

    folder = request.getfixturevalue("mlc_dir")
    plan = mlc_plan(tmp_path)
    session = MlcRuntime().load(ModelRecord(name="tiny", format=Format.MLC, path=str(folder)), plan)
    missing = ModelRecord(name="gone", format=Format.MLC, path=str(tmp_path / "gone"))
    yield Harness(session, lambda: MlcRuntime().load(missing, plan))
    session.close()


@pytest.fixture(params=["mlx", "ollama", "mlc"])
def harness(request, tmp_path):
    yield from {"mlx": _mlx, "ollama": _ollama, "mlc": _mlc}[request.param](request, tmp_path)


def _chat(**sampling) -> ChatRequest:
    return ChatRequest(
        messages=(Message("system", "be brief"), Message("user", "tell me a story")),
        sampling=Sampling(**{"temperature": 0.0, "seed": 1, **sampling}),
    )


def _complete(prompt: str = "once upon a time", **sampling) -> CompletionRequest:
    return CompletionRequest(prompt, Sampling(**{"temperature": 0.0, "seed": 1, **sampling}))


def test_session_follows_the_protocol(harness):
    assert isinstance(harness.session, Session)
    assert isinstance(harness.session.capabilities, frozenset)


def test_streams_chunks_then_one_final_chunk_with_usage(harness):
    chunks = list(harness.session.chat(_chat(max_tokens=8), Cancel()))
    assert len(chunks) >= 2
    *body, last = chunks
    assert all(c.finish_reason is None and c.usage is None for c in body)
    assert last.finish_reason in ("stop", "length")
    assert last.usage.prompt_tokens > 0 and 0 < last.usage.completion_tokens <= 8
    assert "".join(c.text for c in chunks).strip()


def test_max_tokens_ends_with_length(harness):
    chunks = list(harness.session.complete(_complete(max_tokens=5), Cancel()))
    _, finish, usage = fold(chunks)
    assert finish == "length" and usage.completion_tokens == 5
    assert 1 <= len([c for c in chunks if c.text]) <= 5


def test_stop_string_cuts_the_answer_before_it(harness):
    base = fold(harness.session.complete(_complete(max_tokens=12), Cancel()))[0]
    mid = len(base) // 2
    stop = base[mid : mid + 3]
    assert stop.strip(), f"no usable stop string in {base!r}"
    expected = base[: base.find(stop)]
    text, finish, _ = fold(harness.session.complete(_complete(max_tokens=12, stop=(stop,)), Cancel()))
    assert (text, finish) == (expected, "stop")


def test_same_seed_same_answer(harness):
    req = _complete(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=42, max_tokens=8)
    assert fold(harness.session.complete(req, Cancel()))[0] == fold(harness.session.complete(req, Cancel()))[0]


def test_cancel_ends_the_stream_within_one_step(harness):
    cancel = Cancel()
    stream = harness.session.chat(_chat(max_tokens=400), cancel)
    texts = 0
    for chunk in stream:
        assert chunk.finish_reason is None
        texts += bool(chunk.text)
        if texts == 2:
            cancel.set()
            break
    after = list(stream)
    assert len(after) == 1, f"{len(after)} chunks after the cancel"
    assert after[0].finish_reason == "cancelled" and after[0].text == ""
    assert after[0].usage.completion_tokens < 400


def test_cancel_before_the_first_token_yields_no_text(harness):
    cancel = Cancel()
    cancel.set()
    chunks = list(harness.session.complete(_complete(max_tokens=50), cancel))
    assert [(c.text, c.finish_reason) for c in chunks] == [("", "cancelled")]


def test_session_still_works_after_a_cancel(harness):
    cancel = Cancel()
    stream = harness.session.complete(_complete(max_tokens=50), cancel)
    next(stream)
    cancel.set()
    list(stream)
    assert fold(harness.session.complete(_complete(max_tokens=3), Cancel()))[1] == "length"


def test_unknown_model_is_a_clear_model_not_found(harness):
    with pytest.raises(ModelNotFound) as info:
        harness.load_unknown()
    assert "gone" in info.value.message
    assert info.value.hint
