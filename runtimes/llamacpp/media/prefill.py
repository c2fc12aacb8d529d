"""Images and audio inside continuous batching: the encoder thread and the scheduler's media prefill.

How encoding is interleaved with decode steps. A media chunk costs two things: the projector's
*encode* (a vision tower over the image: the expensive part, 0.1 s to several seconds on a CPU)
and a *decode* of the resulting embeddings into the request's sequence (like prefilling as many
text tokens). llama-server does both inside its slot loop, so while one image is encoded every
other stream waits for it. Here:

* the encode runs on an **encoder thread** that owns every ``mtmd_encode_chunk`` call of the
  session (:class:`MediaEncoder`). When a request is admitted to a slot (and so knows which of
  its chunks came from the prefix cache), its remaining chunks are queued there, first in first
  out;
* the **scheduler thread** keeps stepping meanwhile: it prefills the request's text up to its
  first chunk, skips the request while that chunk's encode is running (other requests prefill
  and decode as usual: their steps do not wait), and once the embeddings are there it decodes
  them into the sequence in that request's prefill turn, counted in the step's token budget like
  a text chunk of the same size. A whole chunk goes in one ``llama_decode`` (one ubatch) with
  causal attention off when the projector asks for it (Gemma 3's images attend to each other);
* so a stream's longest gap between two tokens grows by at most one embedding decode, never by
  an encode. The two threads do share the cores: on a CPU an encode slows the decode steps
  running beside it, but does not stop them.

Cancellation: a request that ends (cancelled, failed, done) releases its prompt's chunks; encodes
still queued for it are skipped, one already running finishes and is thrown away, and the
native chunk list is freed on the encoder thread after it (never under a running encode).
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from localrun.errors import InvalidMedia, LocalrunError, RuntimeUnavailable
from localrun.runtimes.llamacpp.media.prompt import MediaPrompt, MediaSpan

if TYPE_CHECKING:
    from localrun.runtimes.llamacpp.cache.slot import Slot
    from localrun.runtimes.llamacpp.decode_calls import DecodeCalls
    from localrun.runtimes.llamacpp.job import Job
    from localrun.runtimes.llamacpp.media.mtmd import Projector

#: What the encoder thread's queue carries: ("encode", media, ticket), ("free", media, None), or None (stop).
_Item = tuple[str, MediaPrompt, "Ticket | None"] | None

log = logging.getLogger(__name__)


class Ticket:
    """One queued encode; the encoder thread fills it, the scheduler thread reads it once ``done``."""

    __slots__ = ("span", "embd", "error", "done", "seconds")

    def __init__(self, span: MediaSpan) -> None:
        self.span = span
        self.embd: ctypes.Array[ctypes.c_float] | None = None
        self.error: LocalrunError | None = None
        self.done = False
        self.seconds = 0.0


class MediaEncoder:
    """The thread that owns a projector's encode calls (see the module docstring)."""

    def __init__(self, projector: Projector, wake: Callable[[], None]) -> None:
        self.projector = projector
        self._wake = wake
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._live: dict[int, MediaPrompt] = {}
        self._lock = threading.Lock()
        self.encoded = 0  # chunks encoded (for tests and logs)
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="llama-media-encoder", daemon=True)
        self._thread.start()

    def submit(self, media: MediaPrompt, spans: list[MediaSpan]) -> dict[int, Ticket]:
        """Queue ``spans`` of ``media``; the tickets are keyed by each span's start."""
        with self._lock:
            self._live[id(media)] = media
        tickets: dict[int, Ticket] = {}
        for span in spans:
            tickets[span.start] = ticket = Ticket(span)
            self._queue.put(("encode", media, ticket))
        return tickets

    def release(self, media: MediaPrompt) -> None:
        """A job using ``media`` ended; the last one frees it (after any encode of it in flight)."""
        media.users -= 1
        if media.users > 0:
            return
        media.cancelled = True
        with self._lock:
            submitted = id(media) in self._live
        if submitted:
            self._queue.put(("free", media, None))
        else:
            media.close()

    def close(self, timeout_s: float = 60.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # the projector must not be freed under a running encode
            raise RuntimeUnavailable("the media encoder did not stop", hint="kill the worker process")
        with self._lock:
            left, self._live = list(self._live.values()), {}
        for media in left:
            media.close()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            op, media, ticket = item
            if op == "free":
                media.close()
                with self._lock:
                    self._live.pop(id(media), None)
                continue
            self._encode(media, cast(Ticket, ticket))  # an encode carries its ticket

    def _encode(self, media: MediaPrompt, ticket: Ticket) -> None:
        try:
            if media.cancelled or media.native is None:
                ticket.error = InvalidMedia("the request ended before its media was encoded", hint="")
                return
            began = time.perf_counter()
            ticket.embd = self.projector.encode(media.native, ticket.span)
            ticket.seconds = time.perf_counter() - began
            self.encoded += 1
            self.seconds += ticket.seconds
            log.debug("encoded a %d-token %s in %.3f s", ticket.span.n_tokens, ticket.span.kind, ticket.seconds)
        except LocalrunError as exc:
            ticket.error = exc
        except Exception as exc:  # noqa: BLE001 - one request's media must not end the thread
            log.exception("encoding a %s failed", ticket.span.kind)
            ticket.error = InvalidMedia(f"encoding this {ticket.span.kind} failed: {exc}", hint="send another file")
        finally:
            ticket.done = True
            self._wake()


class MediaPrefill:
    """The scheduler's media side, held by it: queues a request's chunks with the encoder, says
    what its next prefill piece is, and decodes a chunk's embeddings into its sequence.

    ``decode`` is the scheduler's :class:`~..decode_calls.DecodeCalls`; ``finish`` its way to end a
    job with an error. ``encoder`` is None for a session without a usable projector (then no job
    carries media)."""

    def __init__(
        self,
        llama: Any,
        ctx: Any,
        step_tokens: int,
        encoder: MediaEncoder | None,
        decode: DecodeCalls,
        finish: Callable[..., None],
    ) -> None:
        self._llama, self._ctx, self._step_tokens = llama, ctx, step_tokens
        self.encoder, self._decode, self._finish = encoder, decode, finish

    def admitted(self, job: Job) -> None:
        """``job`` got its slot: queue the chunks the cache did not restore. No speculation for
        it: a draft must never propose a pseudo id (it would reach ``llama_decode`` as a token)."""
        job.spec = None
        media = cast(MediaPrompt, job.media)  # only a job with media is admitted here
        job.encodes = cast(MediaEncoder, self.encoder).submit(media, media.pending(job.cached))

    @staticmethod
    def next_piece(job: Job, start: int) -> tuple[int, MediaSpan | None] | None:
        """(tokens, the media chunk) the job's next prefill piece covers: text up to its next chunk,
        or that whole chunk; None while the chunk's encode is still running."""
        media = job.media
        if media is None:
            return len(job.prompt) - start, None
        span = media.span_at(start)
        if span is None:
            return media.text_run(start), None
        ticket = job.encodes.get(span.start)
        if ticket is not None and not ticket.done:
            return None
        return span.n_tokens, span

    def can_prefill(self, prefilling: Iterable[Job]) -> bool:
        """Whether a job of ``prefilling`` can make progress now (or was cancelled): else the scheduler sleeps."""
        for job in prefilling:
            # Progress first: the cancel is read only for a job that waits (once per step otherwise, in _reap).
            if (
                self.next_piece(job, len(cast("Slot", job.slot).tokens)) is not None
                or job.abandoned
                or job.cancel.is_set()
            ):
                return True
        return False

    def decode(self, job: Job, span: MediaSpan, last: bool) -> int | None:
        """Decode a chunk's embeddings into the job's sequence; the batch row to sample from, or None
        when the job failed (and was finished)."""
        ticket = job.encodes.pop(span.start, None)
        if ticket is None or ticket.error is not None or ticket.embd is None:
            err = ticket.error if ticket is not None and ticket.error else InvalidMedia("media not encoded", hint="")
            self._finish(job, None, error=err)
            return None
        llama, n_embd = self._llama, cast(MediaEncoder, self.encoder).projector.n_embd
        # One call when attention inside the chunk is bidirectional (it must be one ubatch);
        # otherwise pieces of at most a step's budget.
        piece = span.n_tokens if span.non_causal else max(1, min(span.n_tokens, self._step_tokens))
        base = ctypes.addressof(ticket.embd)
        seq = (llama.llama_seq_id * 1)(cast("Slot", job.slot).seq)
        seq_ptr = ctypes.cast(seq, ctypes.POINTER(llama.llama_seq_id))
        if span.non_causal:
            llama.llama_set_causal_attn(self._ctx, False)
        try:
            for off in range(0, span.n_tokens, piece):
                n = min(piece, span.n_tokens - off)
                batch = llama.llama_batch()  # a view on Python-owned arrays: embeddings, no token ids
                pos = (llama.llama_pos * n)(*range(span.start + off, span.start + off + n))
                n_seq = (ctypes.c_int32 * n)(*([1] * n))
                seq_ids = (ctypes.POINTER(llama.llama_seq_id) * n)(*([seq_ptr] * n))
                logits = (ctypes.c_int8 * n)()
                logits[n - 1] = bool(last and off + n == span.n_tokens)
                batch.n_tokens = n
                batch.embd = ctypes.cast(base + off * n_embd * 4, ctypes.POINTER(ctypes.c_float))
                batch.pos, batch.n_seq_id, batch.seq_id, batch.logits = pos, n_seq, seq_ids, logits
                if not self._decode.run([job], batch):
                    return None
        finally:
            if span.non_causal:
                llama.llama_set_causal_attn(self._ctx, True)
        ticket.embd = None
        return n - 1

    def done(self, job: Job) -> None:
        """``job`` ended: its media go back to the encoder (the last user frees them)."""
        if job.media is not None:
            media, job.media = job.media, None
            job.encodes = {}
            cast(MediaEncoder, self.encoder).release(media)
