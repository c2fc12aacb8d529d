"""Native work that must run on the scheduler's thread, asked for from other threads.

ggml's CPU backend parallelises a graph with OpenMP, and OpenMP keeps one team of worker
threads per thread that opens a parallel region. A second thread that computes a graph in
the same process (an embedding request on a server thread) therefore brings a second team
of spinning threads, and on a machine with few cores the two teams slow every later step
of the first: measured here, 62 → 45 tok/s for a plain decode loop once another thread had
decoded once. So every ``llama_decode``/``llama_encode`` of a worker goes through the
scheduler thread: request threads hand it a call and wait for the result
(:meth:`Scheduler.call`), and the scheduler runs the calls between two passes.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class ThreadCalls:
    """Calls waiting for the owning thread. Not locked itself: the scheduler adds and takes
    them under its own condition, so a call is never added after the thread has stopped."""

    def __init__(self) -> None:
        self._pending: list[tuple[Callable[[], Any], Future[Any]]] = []

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._pending.append((fn, future))
        return future

    def take(self) -> list[tuple[Callable[[], Any], Future[Any]]]:
        taken, self._pending = self._pending, []
        return taken

    @staticmethod
    def run(calls: list[tuple[Callable[[], Any], Future[Any]]]) -> None:
        """Run each call, its result or its error going back to the thread that waits."""
        for fn, future in calls:
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - the caller re-raises it on its own thread
                future.set_exception(exc)

    @staticmethod
    def fail(calls: list[tuple[Callable[[], Any], Future[Any]]], error: BaseException) -> None:
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
