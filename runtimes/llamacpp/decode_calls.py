"""``llama_decode`` as every pass of the scheduler calls it: text prefill chunks, media
embeddings (:mod:`.media_prefill`), decode steps and verification passes (:mod:`.speculative_step`).

A mixin of :class:`~.scheduler.Scheduler`: one retry when a unified KV pool ran full and idle
prefixes can go, and how a failed call ends its jobs (a 503-style ``Overloaded`` when the KV
has no room, an error naming the code otherwise).
"""

from __future__ import annotations

import logging

from localrun.errors import LocalrunError, Overloaded

log = logging.getLogger(__name__)


class DecodeCalls:
    """Needs from the scheduler: ``_llama``, ``_ctx``, ``_batch``, ``layout``, ``cache``, ``running``, ``_finish``."""

    def _decode_rc(self, batch=None) -> int:
        batch = self._batch if batch is None else batch
        rc = self._llama.llama_decode(self._ctx, batch)
        if rc == 1 and self.layout.unified and self.cache.evict_idle():
            rc = self._llama.llama_decode(self._ctx, batch)  # the shared pool had idle prefixes in it
        return rc

    def _call_decode(self, jobs: list, batch=None) -> bool:
        rc = self._decode_rc(batch)
        if rc == 0:
            return True
        self._fail(jobs, rc)
        return False

    def _fail(self, jobs: list, rc: int) -> None:
        if rc == 1:
            err: LocalrunError = Overloaded(
                f"the KV cache has no room for this step ({self.running()} requests running)",
                hint="retry in a moment, or load the model with fewer slots or a larger context",
            )
        else:
            err = LocalrunError(
                f"llama_decode failed with code {rc}",
                hint="the context may be out of memory; retry with a shorter prompt",
            )
        for job in jobs:
            self._finish(job, None, error=err)
