"""The worker process and its pipe: streams, cancel, crashes, load errors.

These run real subprocesses: the fake runtime inside a worker for speed, and real
llama.cpp on the tiny GGUF for the crash and cancel paths that matter most.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from localrun.errors import UnknownRuntime, WorkerCrashed
from localrun.types import Cancel, ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling
from localrun.worker.host import WorkerHandle, iter_chunks
from tests.conftest import needs_llama


def _handle(tmp_path, runtime="fake", path="/nonexistent", **options):
    record = ModelRecord(name="m", format=Format.GGUF, path=str(path))
    plan = Plan(runtime=runtime, n_ctx=256, n_threads=2, options=options)
    return WorkerHandle(record, plan, log_path=tmp_path / "worker.log", load_timeout_s=60)


def _chat(text="hello there", max_tokens=16, temperature=0.0):
    sampling = Sampling(max_tokens=max_tokens, temperature=temperature)
    return ChatRequest(messages=(Message("user", text),), sampling=sampling)


def test_fake_runtime_streams_through_a_worker_process(tmp_path):
    h = _handle(tmp_path)
    try:
        assert h.pid != os.getpid()
        chunks = list(iter_chunks(h, _chat(max_tokens=5)))
        assert chunks[-1].finish_reason in ("length", "stop")
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 5
        assert "".join(c.text for c in chunks)
    finally:
        h.close()
    assert h.proc.poll() is not None, "closing the handle must end the worker process"


def test_unknown_runtime_in_worker_is_a_load_error_naming_the_runtimes(tmp_path):
    with pytest.raises(UnknownRuntime) as info:
        _handle(tmp_path, runtime="nope")
    assert "nope" in info.value.message and "llama.cpp" in (info.value.hint or "")


def test_several_requests_multiplexed_on_one_pipe_each_get_their_own_stream(tmp_path):
    h = _handle(tmp_path, fake_delay_s=0.001)
    try:
        streams = [iter_chunks(h, _chat(f"question {i}", max_tokens=3 + i)) for i in range(3)]
        results = [list(s) for s in streams]
        for i, chunks in enumerate(results):
            assert chunks[-1].usage.completion_tokens <= 3 + i
            assert chunks[-1].finish_reason is not None
    finally:
        h.close()


def test_kill_9_mid_stream_becomes_an_error_within_2_s(tmp_path):
    h = _handle(tmp_path, fake_delay_s=0.05)
    try:
        stream = iter_chunks(h, _chat(max_tokens=10_000))
        next(stream)
        os.kill(h.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerCrashed) as info:
            for _ in stream:
                pass
        assert time.monotonic() - t0 < 2.0
        assert "SIGKILL" in info.value.message
        assert not h.alive
        with pytest.raises(WorkerCrashed):
            h.submit(_chat(), lambda ev, data: None)
    finally:
        h.close()


def test_cancel_ends_the_stream_with_cancelled(tmp_path):
    h = _handle(tmp_path, fake_delay_s=0.01)
    try:
        cancel = Cancel()
        got = []
        for chunk in iter_chunks(h, _chat(max_tokens=10_000), cancel):
            got.append(chunk)
            if len(got) == 3:
                cancel.set()
        assert got[-1].finish_reason == "cancelled"
        assert len(got) < 20
    finally:
        h.close()


@needs_llama
def test_llama_worker_cancel_stops_within_a_step(tmp_path, tiny_gguf):
    h = _handle(tmp_path, runtime="llama.cpp", path=tiny_gguf)
    try:
        req = CompletionRequest(prompt="hello", sampling=Sampling(max_tokens=200, temperature=0.0))
        cancel = Cancel()
        got = []
        for chunk in iter_chunks(h, req, cancel):
            got.append(chunk)
            if len(got) == 2:
                cancel.set()
        assert got[-1].finish_reason == "cancelled"
        assert got[-1].usage is None or got[-1].usage.completion_tokens < 200
    finally:
        h.close()


@needs_llama
@pytest.mark.gemma
def test_llama_worker_kill_9_mid_stream_with_gemma(tmp_path, gemma_gguf):
    h = _handle(tmp_path, runtime="llama.cpp", path=gemma_gguf)
    try:
        req = CompletionRequest(prompt="Once upon a time", sampling=Sampling(max_tokens=400, temperature=0.0))
        stream = iter_chunks(h, req)
        next(stream)
        os.kill(h.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerCrashed):
            for _ in stream:
                pass
        assert time.monotonic() - t0 < 2.0
    finally:
        h.close()


def test_worker_server_forgets_finished_requests_even_when_cancelled_late():
    """A cancel that arrives after its request ended must not leave state behind."""
    import io

    from localrun.frames import FrameWriter, read_frame
    from localrun.runtimes.fake import FakeRuntime
    from localrun.worker.main import WorkerServer
    from localrun.worker.ops import to_frame

    out = io.BytesIO()
    server = WorkerServer(FrameWriter(out))
    server.session = FakeRuntime().load(
        ModelRecord(name="m", format=Format.GGUF, path="/x"), Plan(runtime="fake", n_ctx=256)
    )
    frames = io.BytesIO()
    writer = FrameWriter(frames)
    for rid in range(1, 6):
        header, payloads = to_frame(_chat(max_tokens=2))
        writer.send({"id": rid, **header}, payloads)
    for rid in range(1, 6):
        writer.send({"op": "cancel", "id": rid})
    writer.send({"op": "cancel", "id": 999})
    frames.seek(0)
    server.serve(frames)
    deadline = time.monotonic() + 5
    while server.cancels and time.monotonic() < deadline:
        time.sleep(0.05)  # the request thread is still finishing
    time.sleep(0.1)
    out.seek(0)
    events = []
    while (frame := read_frame(out)) is not None:
        events.append(frame[0])
    assert sum(e["ev"] in ("end", "error") for e in events) == 5
    assert server.cancels == {}


def test_worker_process_does_not_inherit_the_api_key(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALRUN_API_KEY", "sk-very-secret")
    monkeypatch.setenv("LOCALRUN_SERVER__API_KEY", "sk-very-secret")
    h = _handle(tmp_path)
    try:
        environ = open(f"/proc/{h.pid}/environ", "rb").read()
        assert b"sk-very-secret" not in environ
        assert b"LOCALRUN_HOME" in environ  # the rest of the environment is passed on
    finally:
        h.close()


# --- the one op dispatcher (worker/ops.py), on both handles ----------------------------------


def test_the_in_process_path_hands_the_session_the_request_object_itself():
    """No dict and no from_dict on the way: the session gets the frozen request the caller made."""
    from localrun.runtimes.fake import FakeRuntime
    from localrun.worker.host import InProcessHandle

    seen = []
    record = ModelRecord(name="m", format=Format.GGUF, path="/nonexistent")
    plan = Plan(runtime="fake", n_ctx=256)

    class Recording(type(FakeRuntime().load(record, plan))):
        def chat(self, req, cancel):
            seen.append(req)
            return super().chat(req, cancel)

    handle = InProcessHandle(record, plan, Recording(record, plan))
    req = _chat(max_tokens=3)
    try:
        assert "".join(c.text for c in iter_chunks(handle, req))
        assert seen == [req] and seen[0] is req
    finally:
        handle.close()


@pytest.mark.parametrize("in_process", [True, False])
def test_embed_and_call_run_through_the_same_dispatcher_on_both_handles(tmp_path, in_process):
    from localrun.errors import UnsupportedFeature
    from localrun.runtimes.fake import FakeRuntime
    from localrun.worker.host import InProcessHandle, call_result
    from localrun.worker.ops import Call, Embed

    if in_process:
        record = ModelRecord(name="m", format=Format.GGUF, path="/nonexistent")
        plan = Plan(runtime="fake", n_ctx=256)
        h = InProcessHandle(record, plan, FakeRuntime().load(record, plan))
    else:
        h = _handle(tmp_path)
    try:
        vectors = call_result(h, Embed(("one", "two words")))
        assert len(vectors) == 2 and all(len(v) == len(vectors[0]) for v in vectors)
        usage = call_result(h, Call("embed_usage", {"inputs": ["one two"]}))
        assert usage["prompt_tokens"] == 2
        with pytest.raises(UnsupportedFeature, match="fake"):
            call_result(h, Call("rerank", {"query": "q", "documents": ["d"]}))
    finally:
        h.close()


def test_a_request_crosses_the_pipe_and_comes_back_equal():
    from localrun.worker.ops import Call, Embed, from_frame, op_name, to_frame

    for req in (
        _chat(),
        CompletionRequest(prompt="hi", sampling=Sampling(max_tokens=2)),
        Embed(("a", "b")),
        Call("tokenize", {"content": "hi"}),
    ):
        header, payloads = to_frame(req)
        assert header["op"] == op_name(req) and from_frame(header, payloads) == req
    with pytest.raises(TypeError):
        op_name({"req": {}})
