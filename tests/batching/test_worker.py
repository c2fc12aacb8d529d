"""The scheduler through a real worker process: concurrent requests over the pipe, and the
worker's memory under a 100-request mixed workload against the planner's estimate."""

from __future__ import annotations

import dataclasses
import random
import sys
import threading
import time

import pytest

from localrun.types import (
    Cancel,
    ChatRequest,
    CompletionRequest,
    FileEntry,
    Format,
    Message,
    ModelRecord,
    Plan,
    Sampling,
)
from localrun.worker.host import WorkerHandle, iter_chunks
from tests.batching.conftest import concurrently
from tests.conftest import needs_llama

pytestmark = [needs_llama, pytest.mark.llama]


def _stream(handle, req, cancel: Cancel | None = None, stop_after: int | None = None):
    """(text, last chunk) of one request; ``stop_after`` chunks then leave (a client gone)."""
    chunks = []
    it = iter_chunks(handle, req, cancel)
    for chunk in it:
        chunks.append(chunk)
        if stop_after is not None and len(chunks) >= stop_after:
            it.close()
            break
    return "".join(c.text for c in chunks), chunks[-1]


def _complete(prompt, max_tokens=24, **sampling):
    return CompletionRequest(prompt=prompt, sampling=Sampling(max_tokens=max_tokens, temperature=0.0, **sampling))


@pytest.mark.parametrize("which", ["tiny", pytest.param("gemma", marks=pytest.mark.gemma)])
def test_four_concurrent_requests_through_a_worker_match_their_solo_runs(which, request, tmp_path):
    path = request.getfixturevalue("tiny_gguf" if which == "tiny" else "gemma_gguf")
    prompts = (
        ["hello world the time is now " * 3, "what was that hello " * 6, "zebra time " * 6, "a b c d e f g h i j " * 3]
        if which == "tiny"
        else [
            "The capital of France is a city of museums, cafes, parks and old stone bridges over a long and slow "
            "river. Its most famous tower",
            "Once upon a time, in a land far away beyond the mountains and the sea, there lived a young fisherman who",
            'def fibonacci(n):\n    """Return the n-th Fibonacci number, counting from zero, iteratively."""\n',
            "The three primary colors of light are red, green and blue, and the three primary colors of paint are red,",
        ]
    )
    # exact_prefix: the concurrent runs reuse the prompts the solo runs left behind
    plan = Plan(
        runtime="llama.cpp", n_ctx=4 * 256, n_threads=2, options={"n_slots": 4, "slot_ctx": 256, "exact_prefix": True}
    )
    h = WorkerHandle(
        ModelRecord(name="m", format=Format.GGUF, path=str(path)),
        plan,
        log_path=tmp_path / "worker.log",
        load_timeout_s=120,
    )
    try:
        solo = [_stream(h, _complete(p)) for p in prompts]
        t0 = time.monotonic()
        together = concurrently(lambda p: _stream(h, _complete(p)), [(p,) for p in prompts])
        elapsed = time.monotonic() - t0
        assert [t for t, _ in together] == [t for t, _ in solo]
        assert [last.usage.completion_tokens for _, last in together] == [
            last.usage.completion_tokens for _, last in solo
        ]
        # the solo runs left their prompts in the idle slots; each prompt is long enough to be
        # reused, so each request takes its own slot in place whatever order they arrive in (a
        # request with nothing to reuse may evict a short cached prompt: cheaper than a copy)
        assert all(last.usage.cached_tokens > 0 for _, last in together)
        # a cancelled stream among running ones, and a chat, through the same pipe
        cancel = Cancel()

        def cancelled_one():
            chunks = []
            for chunk in iter_chunks(h, _complete(prompts[0], max_tokens=200), cancel):
                chunks.append(chunk)
                if len(chunks) == 3:
                    cancel.set()
            return chunks[-1]

        mixed = concurrently(
            lambda k: cancelled_one() if k == 0 else _stream(h, _complete(prompts[k]))[1], [(k,) for k in range(4)]
        )
        assert mixed[0].finish_reason == "cancelled" and mixed[0].usage.completion_tokens < 200
        assert [m.usage.completion_tokens for m in mixed[1:]] == [solo[k][1].usage.completion_tokens for k in (1, 2, 3)]
        chat = ChatRequest(messages=(Message("user", prompts[1]),), sampling=Sampling(max_tokens=8, temperature=0.0))
        assert _stream(h, chat)[1].finish_reason in ("stop", "length")
        assert elapsed < 120
    finally:
        h.close()


# --- memory under a mixed workload ---------------------------------------------------------


def _gemma_record(path) -> ModelRecord:
    from localrun.modelstore.gguf_meta import read_gguf_metadata

    meta = read_gguf_metadata(path).as_dict()
    return ModelRecord(
        name="gemma-3-270m",
        format=Format.GGUF,
        path=str(path),
        files=(FileEntry(str(path), path.stat().st_size),),
        metadata=meta,
    )


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _workload(seed: int, n: int):
    """A mixed list of (request, cancel_after_chunks | None, leave_after_chunks | None)."""
    rng = random.Random(seed)
    system = ("You are a terse assistant for a shipping company. Answer in one sentence. " * 12).strip()
    words = "the quick brown fox jumps over the lazy dog while the cat sleeps near the warm fire".split()
    items = []
    for i in range(n):
        kind = rng.choice(["short", "short", "short", "chat", "chat", "chat", "long", "cancel", "leave"])
        if kind == "chat":
            question = Message("user", f"Question {i}: where is parcel {rng.randrange(999)}?")
            sampling = Sampling(max_tokens=rng.randrange(4, 24), temperature=rng.choice([0.0, 0.8]), seed=i)
            req = ChatRequest(messages=(Message("system", system), question), sampling=sampling)
        elif kind == "long":
            req = _complete(" ".join(rng.choice(words) for _ in range(rng.randrange(400, 1500))), max_tokens=8)
        else:
            text = " ".join(rng.choice(words) for _ in range(rng.randrange(3, 60)))
            req = _complete(text, max_tokens=rng.randrange(4, 24), seed=i)
        items.append((req, 3 if kind == "cancel" else None, 2 if kind == "leave" else None))
    return items


@pytest.mark.gemma
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status")
@pytest.mark.timeout(900)  # 30 s on a quiet 2-core box; its thread joins allow a shared, loaded one
def test_worker_memory_stays_within_the_plan_under_100_mixed_requests(gemma_gguf, tmp_path):
    from localrun.planning.hardware import detect_hardware
    from localrun.planning.planner import plan_placement
    from localrun.runtimes.llamacpp.probe import probe_llamacpp

    record = _gemma_record(gemma_gguf)
    hw = detect_hardware()
    plan = plan_placement(record, hw, {"llama.cpp": probe_llamacpp(hw)})
    if plan.device != "cpu":
        pytest.skip("the plan offloads to a GPU; this measures host memory")
    # The plan's defaults otherwise (slots carved from n_ctx), with a RAM tier small enough that the
    # bound below means something: the tier must keep to its budget and the rest to the plan.
    assert plan.options["kv_ram_bytes"] == plan.memory.prompt_cache > 0  # the planner's choice, counted
    tier = 64 * 2**20
    memory = dataclasses.replace(plan.memory, prompt_cache=tier)
    plan = dataclasses.replace(plan, n_threads=2, memory=memory, options={**plan.options, "kv_ram_bytes": tier})
    h = WorkerHandle(record, plan, log_path=tmp_path / "worker.log", load_timeout_s=120)
    try:
        items = _workload(seed=7, n=100)
        lock = threading.Lock()
        todo = list(items)
        finished = []

        def worker():
            while True:
                with lock:
                    if not todo:
                        return
                    req, cancel_after, leave_after = todo.pop(0)
                cancel = Cancel()
                chunks = []
                it = iter_chunks(h, req, cancel)
                for chunk in it:
                    chunks.append(chunk)
                    if cancel_after is not None and len(chunks) == cancel_after:
                        cancel.set()
                    if leave_after is not None and len(chunks) >= leave_after:
                        it.close()
                        break
                finished.append(chunks[-1] if chunks else None)

        threads = [threading.Thread(target=worker) for _ in range(6)]  # more clients than slots
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
        assert len(finished) == 100
        ends = [c.finish_reason for c in finished if c is not None and c.finish_reason]
        assert {"length", "cancelled"} <= set(ends)
        peak = _peak_rss(h.pid)
        estimate = plan.memory.ceiling  # the loaded model plus its prompt cache's RAM, both in the plan
        print(
            f"worker peak RSS {peak / 2**20:.0f} MiB, plan estimate {estimate / 2**20:.0f} MiB "
            f"({plan.memory.prompt_cache / 2**20:.0f} MiB of it the prompt cache) "
            f"(n_ctx {plan.n_ctx}, {plan.options.get('n_slots', 'default')} slots)"
        )
        assert peak <= estimate
        # every slot came back: as many requests as the default layout has slots run at once, promptly
        again = concurrently(lambda p: _stream(h, _complete(p, max_tokens=8)), [(f"Count to {k}:",) for k in range(4)])
        assert all(last.usage.completion_tokens == 8 or last.finish_reason == "stop" for _, last in again)
    finally:
        h.close()
