"""``llama_decode`` as every pass of the scheduler calls it: text prefill chunks, media
embeddings (:mod:`.media.prefill`), decode steps and verification passes (:mod:`.speculative.step`).

One object the scheduler holds and hands to the collaborators that decode: one retry when a
unified KV pool ran full and idle prefixes can go, and how a failed call ends its jobs (a
503-style ``Overloaded`` when the KV has no room, an error naming the code otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from localrun.errors import LocalrunError, Overloaded

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.prefix import PrefixCache
    from localrun.runtimes.llamacpp.cache.slots import Layout
    from localrun.runtimes.llamacpp.job import Job

log = logging.getLogger(__name__)


class DecodeCalls:
    """The scheduler's ``llama_decode`` calls, on its thread.

    ``finish(job, reason, error=...)`` ends a job (the scheduler's own), ``running()`` counts
    the requests inside the scheduler (for the error's message)."""

    def __init__(
        self,
        llama: Any,
        ctx: Any,
        batch: Any,
        layout: Layout,
        cache: PrefixCache,
        *,
        finish: Callable[..., None],
        running: Callable[[], int],
    ) -> None:
        self._llama, self._ctx, self.batch = llama, ctx, batch
        self._unified = layout.unified
        self._cache, self._finish, self._running = cache, finish, running

    def rc(self, batch: Any = None) -> int:
        """``llama_decode``'s return code for ``batch`` (the scheduler's own by default)."""
        batch = self.batch if batch is None else batch
        rc: int = self._llama.llama_decode(self._ctx, batch)
        if rc == 1 and self._unified and self._cache.evict_idle():
            rc = self._llama.llama_decode(self._ctx, batch)  # the shared pool had idle prefixes in it
        return rc

    def run(self, jobs: list[Job], batch: Any = None) -> bool:
        """Decode ``batch``; on failure end ``jobs`` with the error and return False."""
        rc = self.rc(batch)
        if rc == 0:
            return True
        self.fail(jobs, rc)
        return False

    def fail(self, jobs: list[Job], rc: int) -> None:
        if rc == 1:
            err: LocalrunError = Overloaded(
                f"the KV cache has no room for this step ({self._running()} requests running)",
                hint="retry in a moment, or load the model with fewer slots or a larger context",
            )
        else:
            err = LocalrunError(
                f"llama_decode failed with code {rc}",
                hint="the context may be out of memory; retry with a shorter prompt",
            )
        for job in jobs:
            self._finish(job, None, error=err)
