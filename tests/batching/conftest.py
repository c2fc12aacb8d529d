"""Helpers for the batching tests: load a session with slot options, run requests alone or
together on threads (the way the worker calls a concurrent session)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from localrun.types import Cancel, ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling, Usage


@dataclass(frozen=True)
class Result:
    text: str
    finish: str | None
    usage: Usage
    chunks: int


def load(path, *, n_slots: int = 4, slot_ctx: int = 256, step_tokens: int = 64, **options):
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime

    opts = {"n_slots": n_slots, "slot_ctx": slot_ctx, "step_tokens": step_tokens, **options}
    plan = Plan(runtime="llama.cpp", n_ctx=n_slots * slot_ctx, n_threads=2, n_batch=512, options=opts)
    return LlamaCppRuntime().load(ModelRecord(name="m", format=Format.GGUF, path=str(path)), plan)


def request(prompt: str | list[tuple[str, str]], **sampling):
    sampling.setdefault("temperature", 0.0)
    sampling.setdefault("max_tokens", 24)
    if isinstance(prompt, str):
        return CompletionRequest(prompt=prompt, sampling=Sampling(**sampling))
    return ChatRequest(messages=tuple(Message(r, t) for r, t in prompt), sampling=Sampling(**sampling))


def run(session, req, cancel: Cancel | None = None) -> Result:
    stream = (session.chat if isinstance(req, ChatRequest) else session.complete)(req, cancel or Cancel())
    chunks = list(stream)
    return Result("".join(c.text for c in chunks), chunks[-1].finish_reason, chunks[-1].usage, len(chunks))


def concurrently(fn, args_list, *, join_s: float = 600) -> list:
    """``fn(*args)`` for every args at once, each on its own thread started together at a
    barrier; results in order, the first exception re-raised in the test thread."""
    out: list = [None] * len(args_list)
    start = threading.Barrier(len(args_list))

    def one(i):
        start.wait()
        try:
            out[i] = fn(*args_list[i])
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(args_list))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out


def together(session, reqs) -> list[Result]:
    """Start every request at once on its own thread; results in request order."""
    return concurrently(lambda req: run(session, req), [(r,) for r in reqs], join_s=300)


def assert_idle(session, wait_s: float = 2.0) -> None:
    """No request left inside the scheduler and every slot free (a cancel lands at the
    scheduler's next step, so allow it a moment)."""
    import time

    sched = session._sched
    deadline = time.monotonic() + wait_s
    while (sched.running() or sched.cache.free_slots() != session.layout.n_slots) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sched.running() == 0
    assert sched.cache.free_slots() == session.layout.n_slots


@pytest.fixture
def gemma_path(gemma_gguf):
    return gemma_gguf
