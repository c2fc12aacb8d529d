"""The runtime contract of ``runtimes/base.py``, run on every runtime importable here.

Each runtime comes from one ``harness`` param: the fake always, llama.cpp on the tiny
random-weight GGUF when llama-cpp-python is installed, MLX on a tiny random model when
mlx-lm is, Ollama against the fake server on 127.0.0.1, MLC against the ``mlc_llm serve``
stand-in, and vLLM only where a vLLM interpreter exists (``LOCALRUN_VLLM_PYTHON``). A check
only some runtimes can answer (a 256-token context, prefix reuse, a no-template GGUF) names
the runtimes it covers and is skipped for the others, so no runtime silently drops a check.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from localrun.errors import ContextOverflow, ModelNotFound, RuntimeUnavailable
from localrun.runtimes import get_runtime
from localrun.runtimes.base import Session
from localrun.types import Cancel, ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling, fold
from tests.conftest import needs_llama
from tests.factories import DEFAULT_TINY_TEMPLATE
from tests.runtimes.conftest import mlc_plan, mlx_available
from tests.runtimes.fake_ollama import FakeModel, FakeOllama

N_CTX = 256
GGUF = ("fake", "llama.cpp")  # loaded in process on the tiny GGUF with a 256-token context
ADAPTERS = ("mlx", "ollama", "mlc", "vllm")  # another engine behind the same protocol


@dataclass
class Harness:
    """One loaded session plus the way its runtime is asked for a model that is not there."""

    name: str
    session: Any
    load_unknown: Callable[[], Any]


def _load_gguf(runtime: str, path, *, template: str | None = DEFAULT_TINY_TEMPLATE):
    metadata = {"tokenizer.chat_template": template} if template else {}
    record = ModelRecord(name="tiny", format=Format.GGUF, path=str(path), metadata=metadata)
    return get_runtime(runtime).load(record, Plan(runtime=runtime, n_ctx=N_CTX, n_threads=2, n_batch=64))


def _gguf(name: str):
    def harness(request, tmp_path):
        session = _load_gguf(name, request.getfixturevalue("tiny_gguf"))
        yield Harness(name, session, lambda: _load_gguf(name, tmp_path / "gone.gguf"))
        session.close()

    return harness


def _mlx(request, tmp_path):
    if not mlx_available():
        pytest.skip("mlx / mlx-lm are not installed")
    from localrun.runtimes.mlx import MlxRuntime

    folder = request.getfixturevalue("tiny_mlx_dir")
    plan = Plan(runtime="mlx", n_ctx=512)
    session = MlxRuntime().load(ModelRecord(name="tiny", format=Format.MLX, path=str(folder)), plan)
    missing = ModelRecord(name="gone", format=Format.MLX, path=str(tmp_path / "gone"))
    yield Harness("mlx", session, lambda: MlxRuntime().load(missing, plan))
    session.close()


def _ollama(request, tmp_path):
    from localrun.runtimes.ollama import OllamaRuntime

    with FakeOllama([FakeModel("llama3.2:latest")]) as server:
        rt = OllamaRuntime(host=server.url)
        plan = Plan(runtime="ollama", n_ctx=512)
        session = rt.load(ModelRecord(name="llama3.2", format=Format.GGUF, path=""), plan)
        yield Harness("ollama", session, lambda: rt.load(ModelRecord(name="gone", format=Format.GGUF, path=""), plan))
        session.close()
    assert server.state.errors == []


def _mlc(request, tmp_path):
    from localrun.runtimes.mlc import MlcRuntime

    folder = request.getfixturevalue("mlc_dir")
    plan = mlc_plan(tmp_path)
    session = MlcRuntime().load(ModelRecord(name="tiny", format=Format.MLC, path=str(folder)), plan)
    missing = ModelRecord(name="gone", format=Format.MLC, path=str(tmp_path / "gone"))
    yield Harness("mlc", session, lambda: MlcRuntime().load(missing, plan))
    session.close()


def _vllm(request, tmp_path):
    """vLLM's own server on a tiny Llama with dummy weights; skipped where no vLLM venv exists."""
    from localrun.runtimes.vllm import VllmRuntime, vllm_python

    try:
        vllm_python()
    except RuntimeUnavailable as exc:
        pytest.skip(exc.message)
    from tests.upstreams.vllm_model import write_tiny_llama

    folder = write_tiny_llama(tmp_path / "tiny-vllm")
    plan = Plan(runtime="vllm", n_ctx=512, options={"load_format": "dummy", "log_dir": str(tmp_path / "logs")})
    session = VllmRuntime().load(ModelRecord(name="tiny", format=Format.MLX, path=str(folder)), plan)
    missing = ModelRecord(name="gone", format=Format.MLX, path=str(tmp_path / "gone"))
    yield Harness("vllm", session, lambda: VllmRuntime().load(missing, plan))
    session.close()


HARNESSES = {"fake": _gguf("fake"), "llama.cpp": _gguf("llama.cpp"), "mlx": _mlx, "ollama": _ollama, "mlc": _mlc}
HARNESSES["vllm"] = _vllm
RUNTIMES = [
    pytest.param(name, id=name, marks=[needs_llama, pytest.mark.llama] if name == "llama.cpp" else [])
    for name in HARNESSES
]


@pytest.fixture(params=RUNTIMES)
def harness(request, tmp_path):
    yield from HARNESSES[request.param](request, tmp_path)


def only(harness: Harness, names: tuple[str, ...]) -> Any:
    """The session, for a check that only the runtimes in ``names`` can answer; skip the rest."""
    if harness.name not in names:
        pytest.skip(f"{harness.name} is not among the runtimes this check covers: {', '.join(names)}")
    return harness.session


def _complete(s, prompt="hello", cancel=None, **sampling):
    sampling.setdefault("temperature", 0.0)
    return list(s.complete(CompletionRequest(prompt=prompt, sampling=Sampling(**sampling)), cancel or Cancel()))


def _chat(s, *texts, **sampling):
    sampling.setdefault("temperature", 0.0)
    msgs = tuple(Message("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts))
    return list(s.chat(ChatRequest(messages=msgs, sampling=Sampling(**sampling)), Cancel()))


def _story(**sampling) -> ChatRequest:
    return ChatRequest(
        messages=(Message("system", "be brief"), Message("user", "tell me a story")),
        sampling=Sampling(**{"temperature": 0.0, "seed": 1, **sampling}),
    )


def _once(prompt: str = "once upon a time", **sampling) -> CompletionRequest:
    return CompletionRequest(prompt, Sampling(**{"temperature": 0.0, "seed": 1, **sampling}))


def _text(chunks) -> str:
    return "".join(c.text for c in chunks)


# --- every runtime (the unknown-model check: the adapters)


def test_session_follows_the_protocol(harness):
    assert isinstance(harness.session, Session)
    assert isinstance(harness.session.capabilities, frozenset)


def test_streams_chunks_then_one_final_chunk_with_usage(harness):
    chunks = list(harness.session.chat(_story(max_tokens=8), Cancel()))
    assert len(chunks) >= 2
    *body, last = chunks
    assert all(c.finish_reason is None and c.usage is None for c in body)
    assert last.finish_reason in ("stop", "length")
    assert last.usage.prompt_tokens > 0 and 0 < last.usage.completion_tokens <= 8
    assert "".join(c.text for c in chunks).strip()


def test_max_tokens_ends_with_length(harness):
    chunks = list(harness.session.complete(_once(max_tokens=5), Cancel()))
    _, finish, usage = fold(chunks)
    assert finish == "length" and usage.completion_tokens == 5
    assert 1 <= len([c for c in chunks if c.text]) <= 5


def test_stop_string_cuts_the_answer_before_it(harness):
    base = fold(harness.session.complete(_once(max_tokens=12), Cancel()))[0]
    mid = len(base) // 2
    stop = base[mid : mid + 3]
    assert stop.strip(), f"no usable stop string in {base!r}"
    expected = base[: base.find(stop)]
    text, finish, _ = fold(harness.session.complete(_once(max_tokens=12, stop=(stop,)), Cancel()))
    assert (text, finish) == (expected, "stop")


def test_same_seed_same_answer(harness):
    req = _once(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=42, max_tokens=8)
    assert fold(harness.session.complete(req, Cancel()))[0] == fold(harness.session.complete(req, Cancel()))[0]


def test_cancel_ends_the_stream_within_one_step(harness):
    cancel = Cancel()
    stream = harness.session.chat(_story(max_tokens=400), cancel)
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
    chunks = list(harness.session.complete(_once(max_tokens=50), cancel))
    assert [(c.text, c.finish_reason) for c in chunks] == [("", "cancelled")]


def test_session_still_works_after_a_cancel(harness):
    cancel = Cancel()
    stream = harness.session.complete(_once(max_tokens=50), cancel)
    next(stream)
    cancel.set()
    list(stream)
    assert fold(harness.session.complete(_once(max_tokens=3), Cancel()))[1] == "length"


def test_unknown_model_is_a_clear_model_not_found(harness):
    # the fake never reads its file, and llama.cpp calls a missing GGUF an InvalidModelFile
    only(harness, ADAPTERS)
    with pytest.raises(ModelNotFound) as info:
        harness.load_unknown()
    assert "gone" in info.value.message
    assert info.value.hint


# --- in-process runtimes on the tiny GGUF: a known 256-token context and a chat template


@pytest.mark.parametrize("kind", ["complete", "chat"])
def test_streams_chunks_and_ends_with_finish_reason_and_usage(harness, kind):
    s = only(harness, GGUF)
    chunks = (
        _complete(s, "hello world", max_tokens=12) if kind == "complete" else _chat(s, "hello world", max_tokens=12)
    )
    assert len(chunks) >= 2
    assert all(c.finish_reason is None and c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason in ("stop", "length")
    assert last.usage.prompt_tokens > 0
    assert 0 < last.usage.completion_tokens <= 12
    assert _text(chunks)


def test_max_tokens_is_respected(harness):
    last = _complete(only(harness, GGUF), "hello", max_tokens=5)[-1]
    assert (last.finish_reason, last.usage.completion_tokens) == ("length", 5)


def test_greedy_is_deterministic(harness):
    s = only(harness, GGUF)
    assert _text(_complete(s, "hello world", max_tokens=16)) == _text(_complete(s, "hello world", max_tokens=16))
    assert _text(_chat(s, "the time", max_tokens=16)) == _text(_chat(s, "the time", max_tokens=16))


def test_seed_reproduces_a_sampled_answer(harness):
    s = only(harness, GGUF)
    runs = {
        seed: [_text(_complete(s, "hello", max_tokens=16, temperature=1.0, seed=seed)) for _ in range(2)]
        for seed in (7, 8)
    }
    assert runs[7][0] == runs[7][1]
    assert runs[8][0] == runs[8][1]
    assert runs[7][0] != runs[8][0]


def test_stop_string_cuts_the_answer(harness):
    s = only(harness, GGUF)
    full = _text(_complete(s, "hello", max_tokens=24))
    # A 3-character stop from the middle of the answer, first seen there; it may span tokens.
    k = next(
        k for k in range(len(full) // 3, len(full) - 3) if full[k : k + 3].strip() and full.find(full[k : k + 3]) == k
    )
    chunks = _complete(s, "hello", max_tokens=24, stop=("zzzz-never", full[k : k + 3]))
    assert chunks[-1].finish_reason == "stop"
    assert _text(chunks) == full[:k]


def test_cancel_stops_within_one_step(harness):
    s = only(harness, GGUF)
    cancel = Cancel()
    stream = s.complete(CompletionRequest(prompt="hello", sampling=Sampling(max_tokens=200, temperature=0.0)), cancel)
    seen = [next(stream) for _ in range(3)]
    assert all(c.finish_reason is None for c in seen)
    cancel.set()
    last = next(stream)
    assert last.finish_reason == "cancelled"
    assert last.usage.completion_tokens < 200
    with pytest.raises(StopIteration):
        next(stream)


def test_cancel_before_start_generates_nothing(harness):
    cancel = Cancel()
    cancel.set()
    chunks = _complete(only(harness, GGUF), "hello", cancel=cancel, max_tokens=50)
    assert [c.finish_reason for c in chunks] == ["cancelled"]
    assert chunks[-1].usage.completion_tokens == 0


def test_overlong_prompt_is_context_overflow_naming_both_numbers(harness):
    s = only(harness, GGUF)
    with pytest.raises(ContextOverflow) as info:
        _complete(s, "hello world " * 300, max_tokens=4)
    numbers = [int(n) for n in re.findall(r"\d+", info.value.message)]
    assert N_CTX in numbers and any(n > N_CTX for n in numbers)


def test_max_tokens_is_capped_by_the_context(harness):
    last = _complete(only(harness, GGUF), "hello " * 150, max_tokens=10_000)[-1]
    assert last.finish_reason in ("length", "stop")
    assert last.usage.prompt_tokens + last.usage.completion_tokens <= N_CTX


def test_prefix_reuse_gives_the_same_greedy_answer(harness):
    s = only(harness, GGUF)
    cold = _chat(s, "hello world", "the time", "what was that")
    assert cold[-1].usage.cached_tokens == 0  # the first request of this session
    _chat(s, "hello world", "something else")  # shares the first turn only
    warm = _chat(s, "hello world", "the time", "what was that")
    assert warm[-1].usage.cached_tokens > 0
    assert warm[-1].usage.cached_tokens < warm[-1].usage.prompt_tokens
    assert _text(warm) == _text(cold)


@pytest.mark.parametrize("runtime", [p for p in RUNTIMES if p.values[0] in GGUF])
def test_chat_without_a_template_uses_the_fallback(runtime, tiny_gguf_no_template):
    s = _load_gguf(runtime, tiny_gguf_no_template, template=None)
    try:
        chunks = _chat(s, "hello world", max_tokens=8)
        assert chunks[-1].finish_reason in ("stop", "length")
        # the transcript "User: hello world\nAssistant:" is at least four tokens in any vocabulary here
        assert chunks[-1].usage.prompt_tokens >= 4
    finally:
        s.close()


def test_closed_session_refuses_requests(harness):
    s = only(harness, GGUF)
    s.close()
    s.close()  # idempotent
    with pytest.raises(RuntimeUnavailable):
        _complete(s, "hello", max_tokens=2)
