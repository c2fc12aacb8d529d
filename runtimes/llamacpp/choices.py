"""Several choices from one prompt (OpenAI's ``n``): one prefill, then parallel decoding.

The first choice is submitted alone. When its prompt is prefilled — the moment its sampler
draws the first token, on the scheduler thread — the other choices are submitted; the
prefix cache then gives each a slot with the prompt copied from the first one's
(``llama_memory_seq_cp``), so only the prompt's last token is evaluated again per choice
(prompts under the cache's ``MIN_COPY`` tokens are cheaper to prefill and are). From there the
choices decode side by side in the scheduler's batch like any other requests.

Each choice is an ordinary :class:`~.scheduler.Job` whose output queue is tagged with its
index, so one reader merges them: chunks go out with ``Chunk.index``, every choice ends with
its own final chunk (finish reason, no usage), and the last chunk of all carries the usage
of the whole request — the prompt counted once, the completions and the speculative
decoding's drafted and accepted tokens summed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from localrun.runtimes.llamacpp.job import Job
from localrun.types import Cancel, Chunk, Usage

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.decode import Sampler

#: The queue every choice's chunks go to, each under its index.
Merged = queue.SimpleQueue[tuple[int, Chunk | BaseException]]

log = logging.getLogger(__name__)


class _Tagged:
    """A job's output queue that files each item under the job's choice index."""

    __slots__ = ("_shared", "_index")

    def __init__(self, shared: Merged, index: int) -> None:
        self._shared, self._index = shared, index

    def put(self, item: Chunk | BaseException) -> None:
        self._shared.put((self._index, item))


class _OnFirstSample:
    """Wraps the first choice's sampler: its first draw means the prompt is in the KV cache."""

    __slots__ = ("_inner", "_then")
    _then: Callable[[], None] | None  # None once called

    def __init__(self, inner: Sampler, then: Callable[[], None]) -> None:
        self._inner, self._then = inner, then

    def sample(self, ctx: Any, index: int) -> int:
        token = self._inner.sample(ctx, index)
        if self._then is not None:
            then, self._then = self._then, None
            then()
        return token

    def free(self) -> None:
        self._inner.free()


def stream_choices(submit: Callable[[Job], None], jobs: list[Job], cancel: Cancel) -> Iterator[Chunk]:
    """Run ``jobs`` (one per choice, same prompt) and yield their chunks merged, by index.

    ``submit`` hands a job to the scheduler (from any thread); nothing is submitted before the
    first chunk is asked for. Closing the generator early, or ``cancel``, abandons every choice.
    """
    shared: Merged = queue.SimpleQueue()
    for i, job in enumerate(jobs):
        job.out = _Tagged(shared, i)
    lock, sent = threading.Lock(), [False]

    def release_rest() -> None:
        with lock:
            if sent[0]:
                return
            sent[0] = True
        for job in jobs[1:]:
            submit(job)

    first_build = jobs[0].build_sampler
    jobs[0].build_sampler = lambda: _OnFirstSample(first_build(), release_rest)
    submit(jobs[0])
    yield from _merge(shared, jobs, cancel, release_rest)


def _merge(shared: Merged, jobs: list[Job], cancel: Cancel, release_rest: Callable[[], None]) -> Iterator[Chunk]:
    open_ = set(range(len(jobs)))
    total = Usage()
    try:
        while open_:
            for i in open_:
                jobs[i].parked = True
            index, item = shared.get()
            for i in open_:
                jobs[i].parked = False
            if isinstance(item, BaseException):
                raise item
            if item.finish_reason is None and cancel.is_set():
                yield Chunk(finish_reason="cancelled", usage=total)
                return
            if item.finish_reason is None:
                yield Chunk(text=item.text, logprobs=item.logprobs, index=index)
                continue
            open_.discard(index)
            if index == 0:
                release_rest()  # the first choice ended before drawing a token (or was cancelled)
            total = _add(total, item.usage or Usage(), first=index == 0)
            if item.finish_reason == "cancelled":
                yield Chunk(finish_reason="cancelled", usage=total)
                return
            last = not open_
            yield Chunk(
                text=item.text,
                finish_reason=item.finish_reason,
                logprobs=item.logprobs,
                index=index,
                usage=total if last else None,
            )
    finally:
        for job in jobs:
            job.abandoned = True  # finished ones are gone already; the rest stop at the next step


def _add(total: Usage, u: Usage, *, first: bool) -> Usage:
    """A request's usage with one more choice's: the prompt once (and its cache hits as the
    first choice saw them), completions and drafts summed."""
    return Usage(
        max(total.prompt_tokens, u.prompt_tokens),
        total.completion_tokens + u.completion_tokens,
        u.cached_tokens if first else total.cached_tokens,
        total.drafted_tokens + u.drafted_tokens,
        total.accepted_tokens + u.accepted_tokens,
    )
