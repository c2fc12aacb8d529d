"""llama.cpp specifics: loading, prompt building, the sandboxed template path, threads,
quiet logs, session lifecycle; and real text from Gemma 3 270M."""

from __future__ import annotations

import subprocess
import sys

import pytest

from localrun.errors import ContextOverflow, InvalidModelFile, TemplateError, UnsupportedFeature
from localrun.types import Cancel, ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling
from tests.conftest import needs_llama
from tests.factories import write_tiny_llama_gguf

pytestmark = [needs_llama, pytest.mark.llama]


def _load(path, **plan):
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime

    plan.setdefault("n_ctx", 256)
    return LlamaCppRuntime().load(
        ModelRecord(name="m", format=Format.GGUF, path=str(path)), Plan(runtime="llama.cpp", **plan)
    )


def _chat(s, text, **sampling):
    sampling.setdefault("temperature", 0.0)
    return list(s.chat(ChatRequest(messages=(Message("user", text),), sampling=Sampling(**sampling)), Cancel()))


def _complete(s, prompt, **sampling):
    sampling.setdefault("temperature", 0.0)
    return list(s.complete(CompletionRequest(prompt=prompt, sampling=Sampling(**sampling)), Cancel()))


def _text(chunks):
    return "".join(c.text for c in chunks)


def test_probe_reports_version_and_devices():
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime

    status = LlamaCppRuntime().probe()
    assert status.available and status.version
    assert "cpu" in status.devices
    assert "system_info" in status.details


def test_missing_and_garbage_files_are_invalid_model_file(tmp_path):
    with pytest.raises(InvalidModelFile, match="not found"):
        _load(tmp_path / "nope.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 60)
    with pytest.raises(InvalidModelFile, match="could not load") as info:
        _load(junk)
    assert "bad GGUF version" in info.value.message  # llama.cpp's own reason, from its log


def test_wrong_format_and_kv_type_are_refused(tiny_gguf):
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime

    with pytest.raises(UnsupportedFeature):
        LlamaCppRuntime().load(ModelRecord(name="m", format=Format.MLX, path=str(tiny_gguf)), Plan(runtime="llama.cpp"))
    with pytest.raises(UnsupportedFeature, match="KV cache"):
        _load(tiny_gguf, kv_type="q3_weird")


def test_threads_are_set_for_decode_and_batch(tiny_gguf):
    s = _load(tiny_gguf, n_threads=3)
    try:
        assert s._llama.llama_n_threads(s._ctx) == 3
        assert s._llama.llama_n_threads_batch(s._ctx) == 3
    finally:
        s.close()


def test_chat_prompt_renders_the_gguf_template_without_a_double_bos(tiny_gguf, tmp_path):
    s = _load(tiny_gguf)
    try:
        tokens, stops = s.chat_prompt([Message("user", "hello")])
        assert stops == ()
        assert tokens.count(s._llama.llama_vocab_bos(s._vocab)) == 1
        assert tokens == s.tokenize("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special=True)
        assert s.tokenize("<|im_start|>", add_special=False) == [3]  # special tokens are parsed
    finally:
        s.close()
    # a template that writes the BOS itself: tokenizing must not add a second one
    path = write_tiny_llama_gguf(
        tmp_path / "bos.gguf", chat_template="{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    s = _load(path)
    try:
        tokens, _ = s.chat_prompt([Message("user", "hello")])
        assert tokens[0] == 1 and tokens.count(1) == 1
    finally:
        s.close()


def test_no_template_falls_back_to_a_transcript_with_a_stop(tiny_gguf_no_template):
    s = _load(tiny_gguf_no_template)
    try:
        assert s.chat_template is None
        tokens, stops = s.chat_prompt([Message("system", "be brief"), Message("user", "hello")])
        assert stops == ("User:", "Assistant:")
        assert tokens == s.tokenize("System: be brief\nUser: hello\nAssistant:", add_special=True)
    finally:
        s.close()


def test_template_bomb_in_the_gguf_is_a_template_error_and_the_session_still_works(tmp_path):
    bomb = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    s = _load(write_tiny_llama_gguf(tmp_path / "bomb.gguf", chat_template=bomb), options={"template_timeout_s": 0.5})
    try:
        with pytest.raises(TemplateError, match="budget"):
            _chat(s, "hello", max_tokens=2)
        assert _complete(s, "hello", max_tokens=2)[-1].usage.completion_tokens == 2
    finally:
        s.close()


def test_injection_template_in_the_gguf_never_runs(tmp_path):
    sentinel = tmp_path / "pwned"
    evil = "{{ cycler.__init__.__globals__.os.system('touch " + str(sentinel) + "') }}{{ messages[0].content }}"
    s = _load(write_tiny_llama_gguf(tmp_path / "evil.gguf", chat_template=evil))
    try:
        with pytest.raises(TemplateError):
            _chat(s, "hello", max_tokens=2)
        assert not sentinel.exists()
    finally:
        s.close()


def test_a_second_concurrent_stream_runs_alongside_the_first(tiny_gguf):
    s = _load(tiny_gguf, n_ctx=512, options={"n_slots": 2})
    try:
        assert s.concurrent
        first = s.complete(
            CompletionRequest(prompt="hello", sampling=Sampling(max_tokens=20, temperature=0.0)), Cancel()
        )
        next(first)
        second = list(s.complete(CompletionRequest(prompt="hello", sampling=Sampling(max_tokens=2)), Cancel()))
        assert second[-1].usage.completion_tokens == 2
        rest = list(first)
        assert rest[-1].finish_reason == "length" and rest[-1].usage.completion_tokens == 20
    finally:
        s.close()


def test_close_during_a_stream_ends_it_and_frees(tiny_gguf):
    s = _load(tiny_gguf)
    stream = s.complete(CompletionRequest(prompt="hello", sampling=Sampling(max_tokens=100, temperature=0.0)), Cancel())
    next(stream)
    s.close()  # stops the scheduler thread (the only one touching the context), then frees
    last = list(stream)[-1]
    assert last.finish_reason == "cancelled"
    assert s._freed


def test_slots_default_to_sharing_the_plans_context(tiny_gguf):
    """Without slot options the KV cache stays the size the planner counted: plan.n_ctx tokens."""
    s = _load(tiny_gguf, n_ctx=8192)
    try:
        assert (s.layout.n_slots, s.layout.slot_ctx, s.n_ctx) == (4, 2048, 2048)
        assert s._llama.llama_n_ctx(s._ctx) == 8192
    finally:
        s.close()
    s = _load(tiny_gguf, n_ctx=1024)
    try:
        assert (s.layout.n_slots, s.n_ctx) == (1, 1024)
    finally:
        s.close()


def test_prompt_exactly_at_the_limit_is_accepted_and_one_more_is_not(tiny_gguf):
    s = _load(tiny_gguf, n_ctx=64)
    try:
        fits = next(p for p in ("hello" + " the" * k for k in range(80)) if len(s.tokenize(p, add_special=True)) == 63)
        assert len(s.tokenize(fits + " the", add_special=True)) == 64
        last = _complete(s, fits, max_tokens=50)[-1]
        assert (last.finish_reason, last.usage.completion_tokens) == ("length", 1)
        with pytest.raises(ContextOverflow, match="64 tokens but the context holds 64"):
            _complete(s, fits + " the", max_tokens=1)
    finally:
        s.close()


def test_loading_prints_nothing_to_stderr(tiny_gguf):
    """llama.cpp logs to stderr by default; a worker's stderr is the user's terminal."""
    code = (
        "from localrun.runtimes.llamacpp.session import LlamaCppRuntime\n"
        "from localrun.types import *\n"
        f"s = LlamaCppRuntime().load(ModelRecord(name='m', format=Format.GGUF, path={str(tiny_gguf)!r}), "
        "Plan(runtime='llama.cpp', n_ctx=128))\n"
        "print(''.join(c.text for c in s.complete(CompletionRequest(prompt='hello', "
        "sampling=Sampling(max_tokens=3)), Cancel())) and 'ok')\n"
        "s.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert out.stderr == ""


# --- the real model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma(gemma_gguf):
    s = _load(gemma_gguf, n_ctx=1024, n_threads=2)
    yield s
    s.close()


@pytest.mark.gemma
def test_gemma_answers_the_capital_of_france(gemma):
    chunks = _chat(gemma, "What is the capital of France?", max_tokens=16)
    assert "Paris" in _text(chunks)
    assert chunks[-1].finish_reason == "stop"  # the transcript's "User:" or EOG ends the turn


@pytest.mark.gemma
def test_gemma_completes_a_fact_within_8_greedy_tokens(gemma):
    chunks = _complete(gemma, "The capital of Japan is", max_tokens=8)
    assert "Tokyo" in _text(chunks)
    assert chunks[-1].usage.completion_tokens <= 8


@pytest.mark.gemma
def test_gemma_second_turn_reuses_the_first(gemma):
    first = _chat(gemma, "What is the capital of France?", max_tokens=16)
    msgs = (
        Message("user", "What is the capital of France?"),
        Message("assistant", _text(first).strip()),
        Message("user", "And the capital of Italy?"),
    )
    second = list(gemma.chat(ChatRequest(messages=msgs, sampling=Sampling(max_tokens=16, temperature=0.0)), Cancel()))
    assert second[-1].usage.cached_tokens >= first[-1].usage.prompt_tokens - 1
    assert _text(second).strip()


@pytest.mark.gemma
def test_gemma_multibyte_text_streams_without_replacement_characters(gemma):
    chunks = _complete(gemma, "日本の首都は", max_tokens=12)
    text = _text(chunks)
    assert any(ord(ch) > 0x3000 for ch in text)
    assert "\ufffd" not in text


class _CancelAfter(Cancel):
    """Reports cancelled from its n-th check on: a cancel that lands mid-prefill."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks_left = checks

    def is_set(self) -> bool:
        self.checks_left -= 1
        return self.checks_left < 0


def test_cancel_is_checked_between_prefill_chunks_and_the_done_part_is_reused(tiny_gguf):
    s = _load(tiny_gguf, n_batch=64)
    try:
        assert s.layout.step_tokens == 64
        prompt = "hello world " * 110
        n_prompt = len(s.tokenize(prompt, add_special=True))
        assert n_prompt > 3 * 64
        req = CompletionRequest(prompt=prompt, sampling=Sampling(max_tokens=4, temperature=0.0))
        chunks = list(s.complete(req, _CancelAfter(2)))  # the scheduler checks once per step
        assert [c.finish_reason for c in chunks] == ["cancelled"]
        assert chunks[-1].usage.completion_tokens == 0
        slot = s._sched.cache.slots[0]
        assert len(slot.tokens) == 2 * 64  # two chunks ran, the third was never started
        again = list(s.complete(req, Cancel()))
        assert again[-1].usage.cached_tokens == 2 * 64
        assert again[-1].usage.completion_tokens == 4
    finally:
        s.close()
