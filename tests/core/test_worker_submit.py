"""``WorkerHandle.submit`` leaves no entry behind when a request cannot be sent or fails.

A leaked entry kept ``/health``'s ``in_flight`` above zero with nothing running (and a model
with requests in flight is never evicted): a lone surrogate in a message could not be encoded
for the pipe, and the entry registered just before stayed.
"""

from __future__ import annotations

import asyncio

import pytest

from localrun.errors import ContextOverflow, LocalrunError
from localrun.types import ChatRequest, CompletionRequest, Format, Message, ModelRecord, Plan, Sampling
from localrun.worker.host import WorkerHandle, aiter_chunks, iter_chunks
from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]


@pytest.fixture(scope="module")
def worker(tmp_path_factory, tiny_gguf):
    record = ModelRecord(name="tiny", format=Format.GGUF, path=str(tiny_gguf))
    plan = Plan(runtime="llama.cpp", n_ctx=256, n_threads=1)
    handle = WorkerHandle(record, plan, log_path=tmp_path_factory.mktemp("w") / "worker.log", load_timeout_s=60)
    yield handle
    handle.close()


def _chat(text: str, max_tokens: int = 4) -> ChatRequest:
    return ChatRequest(messages=(Message("user", text),), sampling=Sampling(max_tokens=max_tokens, temperature=0.0))


def test_text_that_cannot_cross_the_pipe_is_an_error_and_no_entry(worker):
    with pytest.raises(LocalrunError, match="cannot be sent"):
        worker.submit(_chat("a\ud800b"), lambda ev, data: None)
    assert worker.in_flight == 0
    assert list(iter_chunks(worker, _chat("hello")))[-1].finish_reason  # the worker still answers


def test_an_error_in_the_worker_ends_the_entry(worker):
    too_long = CompletionRequest(prompt="", prompt_tokens=(1,) * 300, sampling=Sampling(max_tokens=4))
    with pytest.raises(ContextOverflow):  # 300 tokens in a 256-token context: the worker refuses it
        list(iter_chunks(worker, too_long))
    assert worker.in_flight == 0


def test_a_cancelled_reader_ends_the_entry(worker):
    async def leave_early() -> None:
        stream = aiter_chunks(worker, _chat("tell me a long story", max_tokens=200))
        await stream.__anext__()
        await stream.aclose()  # a client gone: the worker is told to stop

    asyncio.run(leave_early())
    deadline = asyncio.run(_wait_zero(worker))
    assert deadline, f"in_flight stayed at {worker.in_flight}"


async def _wait_zero(worker, timeout_s: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while worker.in_flight and loop.time() < end:
        await asyncio.sleep(0.02)
    return worker.in_flight == 0
