"""The parent's handle on a loaded model: a worker subprocess, or a thread for runtimes
that need no isolation (the fake runtime, HTTP-backed runtimes).

Both handles offer the same small interface — ``submit(request, sink)``, ``cancel(rid)``,
``close()`` — where a request is a core object (:data:`.ops.Request`: ChatRequest,
CompletionRequest, Embed, Call). Both run it with the one dispatcher of :mod:`.ops`; only
``WorkerHandle`` turns it into a frame for its pipe. The adaptors ``iter_chunks``
(blocking), ``aiter_chunks`` (asyncio) and ``call_result`` turn a submission into a chunk
stream or a result. Events reach a sink from the handle's reader thread; the adaptors move
them onto a queue without a thread-pool hop per token.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from localrun.errors import LocalrunError, RuntimeUnavailable, WorkerCrashed
from localrun.frames import FrameWriter, read_frame
from localrun.runtimes.base import Session
from localrun.types import Cancel, Chunk, ModelRecord, Plan
from localrun.worker import ops
from localrun.worker.ops import Call, Embed, Request

log = logging.getLogger(__name__)

#: Environment a worker process does not inherit.
_SECRET_ENV = frozenset({"LOCALRUN_API_KEY", "LOCALRUN_SERVER__API_KEY"})

Sink = Callable[[str, Any], None]  # (event, data): "chunk" Chunk | "result" Any | "end" None | "error" LocalrunError
Event = tuple[str, Any]


class FrameTooLarge(LocalrunError):
    """A request over what one frame of the worker pipe carries (localrun/frames.py): refused, and
    the worker, which never saw it, keeps serving."""

    http_status = 413
    code = "request_too_large"


class Spawns:
    """Worker processes started and still loading. A server stopping (SIGTERM) while one loads
    kills it: before, the load went on in its own session after the server had gone, and the
    worker outlived it until its load ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self.closed = False

    def spawned(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            if not self.closed:
                self._procs.add(proc)
                return
        proc.kill()  # started after the stop: a worker still loading has nothing to save

    def settled(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)

    def close(self) -> None:
        """No more workers: kill those still loading (their loads then fail in their callers)."""
        with self._lock:
            self.closed, procs = True, list(self._procs)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


class WorkerHandle:
    """A model loaded in its own process. Dies alone; its open requests get WorkerCrashed."""

    def __init__(
        self,
        record: ModelRecord,
        plan: Plan,
        *,
        log_path: Path,
        load_timeout_s: float = 600.0,
        spawns: Spawns | None = None,
    ):
        self.record = record
        self.plan = plan
        self.log_path = log_path
        self.capabilities: frozenset[str] = frozenset()
        self._ids = itertools.count(1)
        self._sinks: dict[int, Sink] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._load_error: LocalrunError | None = None
        self.alive = False
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
        env = {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}  # a worker never needs the server's key
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localrun.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the parent only
        )
        self.pid = self.proc.pid
        if spawns is not None:
            spawns.spawned(self.proc)
            try:
                self._start(record, plan, load_timeout_s)
            finally:
                spawns.settled(self.proc)
        else:
            self._start(record, plan, load_timeout_s)

    def _start(self, record: ModelRecord, plan: Plan, load_timeout_s: float) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout
        self._writer = FrameWriter(self._stdin)
        self._reader = threading.Thread(target=self._read_loop, name=f"worker-{self.pid}", daemon=True)
        self._reader.start()
        self._writer.send({"op": "load", "runtime": plan.runtime, "record": record.to_dict(), "plan": plan.to_dict()})
        if not self._ready.wait(load_timeout_s):
            self.kill()
            raise RuntimeUnavailable(f"{record.name}: the worker did not finish loading in {load_timeout_s:.0f} s")
        if self._load_error is not None:
            self.kill()
            raise self._load_error
        if not self.alive:
            raise RuntimeUnavailable(
                f"{record.name}: the worker exited while loading ({self._exit_text()})",
                hint=f"see {self.log_path}",
            )

    # -- reading -----------------------------------------------------------------------
    def _read_loop(self) -> None:
        stream = self._stdout
        try:
            while True:
                frame = read_frame(stream)
                if frame is None:
                    break
                self._dispatch(frame[0])
        except (OSError, ValueError) as exc:
            log.warning("worker %s pipe broke: %s", self.pid, exc)
        finally:
            self._on_exit()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        ev = msg.get("ev")
        if ev == "chunk":
            sink = self._sinks.get(msg["id"])
            if sink:
                sink("chunk", Chunk.from_dict(msg["c"]))
        elif ev in ("end", "error", "result"):
            with self._lock:
                sink = self._sinks.pop(msg["id"], None) if ev != "result" else self._sinks.get(msg["id"])
            if sink:
                if ev == "error":
                    sink("error", LocalrunError.from_dict(msg["error"]))
                elif ev == "result":
                    sink("result", msg["data"])
                else:
                    sink("end", None)
        elif ev == "ready":
            self.capabilities = frozenset(msg["info"].get("capabilities", ()))
            self.alive = True
            self._ready.set()
        elif ev == "load_error":
            self._load_error = LocalrunError.from_dict(msg["error"])
            self._ready.set()

    def _exit_text(self) -> str:
        from localrun.proc import describe_exit

        return describe_exit(self.proc.poll())

    def _on_exit(self) -> None:
        self.alive = False
        self._ready.set()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        with self._lock:
            sinks, self._sinks = self._sinks, {}
        if sinks:
            err = WorkerCrashed(
                f"the worker running {self.record.name} stopped ({self._exit_text()}) during the request",
                hint=f"retry; the next request starts a new worker. Worker log: {self.log_path}",
            )
            for sink in sinks.values():
                sink("error", err)
        self._log_file.close()

    # -- requests ----------------------------------------------------------------------
    def submit(self, request: Request, sink: Sink) -> int:
        """Send ``request`` to the worker; its events go to ``sink``.

        The sink is registered before the frame is written (the answer may come back before
        ``send`` returns), so every way the write can fail — a broken pipe, text that cannot be
        encoded, a cancellation — takes the entry out again: a leaked entry keeps ``in_flight``
        above zero with nothing running, and the model is then never idle enough to unload.
        """
        frame, payloads = ops.to_frame(request)  # the one place a request is serialised: it crosses a pipe
        rid = next(self._ids)
        with self._lock:
            if not self.alive:
                raise WorkerCrashed(f"the worker running {self.record.name} is not running ({self._exit_text()})")
            self._sinks[rid] = sink
        sent = False
        try:
            self._writer.send({"id": rid, **frame}, payloads)
            sent = True
        except OSError as exc:
            raise WorkerCrashed(f"cannot reach the worker running {self.record.name}: {exc}") from exc
        except ValueError as exc:
            if "exceed" not in str(exc):
                raise LocalrunError(
                    f"the request to {self.record.name} cannot be sent to its worker: {exc}",
                    hint="send valid Unicode text",
                ) from exc
            raise FrameTooLarge(
                f"the request to {self.record.name} is too large for its worker: {exc}",
                hint="send fewer or smaller images, token ids or texts in one request",
            ) from exc
        except (UnicodeError, TypeError) as exc:
            raise LocalrunError(
                f"the request to {self.record.name} cannot be sent to its worker: {exc}",
                hint="send valid Unicode text",
            ) from exc
        finally:
            if not sent:
                with self._lock:
                    self._sinks.pop(rid, None)
        return rid

    def cancel(self, rid: int) -> None:
        if self.alive:
            try:
                self._writer.send({"op": "cancel", "id": rid})
            except OSError:
                log.debug("cancel of %s: worker already gone", rid)

    @property
    def in_flight(self) -> int:
        return len(self._sinks)

    @property
    def bytes_sent(self) -> int:
        """Bytes written to the worker's pipe so far (frames and their payloads)."""
        return self._writer.bytes_written

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self, timeout_s: float = 30.0) -> None:
        """Ask the worker to stop (cancelling what runs), then make sure it has. The wait is long
        enough for a llama.cpp session to write its prefix cache to disk (it waits 20 s at most,
        runtimes/llamacpp/cache/prefix_disk.py); a worker with nothing to write exits at once."""
        if self.proc.poll() is None:
            try:
                self._writer.send({"op": "shutdown"})
                self._stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("worker %s did not stop in %.0f s; killing it", self.pid, timeout_s)
                self.kill()
        self._reader.join(timeout=timeout_s)


class InProcessHandle:
    """A session run on threads in this process, for runtimes with nothing native to isolate."""

    def __init__(self, record: ModelRecord, plan: Plan, session: Session) -> None:
        self.record = record
        self.plan = plan
        self.session = session
        self.pid = os.getpid()
        self.capabilities = frozenset(getattr(session, "capabilities", ()))
        self._open = True
        self._ids = itertools.count(1)
        self._cancels: dict[int, Cancel] = {}
        self._serial = threading.Lock() if not getattr(session, "concurrent", False) else None

    @property
    def alive(self) -> bool:
        """Open, and the session's own process (an MLC server, say) still running."""
        return self._open and bool(getattr(self.session, "alive", True))

    def submit(self, request: Request, sink: Sink) -> int:
        ops.op_name(request)  # a wrong request fails here, in the caller, not on the thread
        rid = next(self._ids)
        cancel = self._cancels[rid] = Cancel()
        threading.Thread(target=self._run, args=(rid, request, sink, cancel), daemon=True).start()
        return rid

    def _run(self, rid: int, request: Request, sink: Sink, cancel: Cancel) -> None:
        lock = self._serial or _NullLock()
        try:
            with lock:
                result = ops.run(
                    self.session, request, cancel, lambda chunk: sink("chunk", chunk), runtime=self.plan.runtime
                )
                if not ops.streams(request):
                    sink("result", result)
            sink("end", None)
        except LocalrunError as exc:
            sink("error", exc)
        except Exception as exc:  # noqa: BLE001 - a runtime bug becomes this request's error, not a dead thread
            log.exception("request %s failed in %s", rid, self.record.name)
            sink("error", LocalrunError(f"{type(exc).__name__}: {exc}"))
        finally:
            self._cancels.pop(rid, None)

    def cancel(self, rid: int) -> None:
        c = self._cancels.get(rid)
        if c:
            c.set()

    @property
    def in_flight(self) -> int:
        return len(self._cancels)

    def close(self, timeout_s: float = 5.0) -> None:
        for c in list(self._cancels.values()):
            c.set()
        deadline = time.monotonic() + timeout_s
        while self._cancels and time.monotonic() < deadline:
            time.sleep(0.01)
        self._open = False
        self.session.close()


class _NullLock:
    def __enter__(self) -> _NullLock:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Handle(Protocol):
    """What the adaptors below need of a handle (``WorkerHandle``, ``InProcessHandle``)."""

    def submit(self, request: Request, sink: Sink) -> int: ...

    def cancel(self, rid: int) -> None: ...


def _chunk_or_end(ev: str, data: Any) -> Chunk | None:
    """One stream event: a chunk to yield, ``None`` at the end, or the request's error raised."""
    if ev == "chunk":
        chunk: Chunk = data
        return chunk
    if ev == "error":
        raise data
    return None


def iter_chunks(handle: Handle, request: Request, cancel: Cancel | None = None) -> Iterator[Chunk]:
    """Blocking chunk stream of a chat or completion request. Closing the generator early (or
    ``cancel``) cancels the request."""
    q: queue.SimpleQueue[Event] = queue.SimpleQueue()
    rid = handle.submit(request, lambda ev, data: q.put((ev, data)))
    done = False
    try:
        while True:
            if cancel is not None and cancel.is_set():
                handle.cancel(rid)
                cancel = None  # sent once; the worker ends the stream with "cancelled"
            try:
                event = q.get(timeout=0.05)
            except queue.Empty:
                continue
            done = event[0] != "chunk"
            chunk = _chunk_or_end(*event)
            if chunk is None:
                return
            yield chunk
    finally:
        if not done:
            handle.cancel(rid)


async def aiter_chunks(handle: Handle, request: Request) -> AsyncIterator[Chunk]:
    """Asyncio chunk stream. Leaving the loop early (a client gone) cancels the request."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[Event] = asyncio.Queue()

    def sink(ev: str, data: Any) -> None:
        try:
            loop.call_soon_threadsafe(q.put_nowait, (ev, data))
        except RuntimeError:  # the event loop is gone (server shutting down): nobody is listening
            log.debug("dropping %s event: event loop closed", ev)

    rid = handle.submit(request, sink)
    done = False
    try:
        while True:
            event = await q.get()
            done = event[0] != "chunk"
            chunk = _chunk_or_end(*event)
            if chunk is None:
                return
            yield chunk
    finally:
        if not done:
            handle.cancel(rid)


def call_result(handle: Handle, request: Embed | Call, timeout_s: float = 600.0) -> Any:
    """Run a non-streaming request (embed, call) and return its result."""
    q: queue.SimpleQueue[Event] = queue.SimpleQueue()
    handle.submit(request, lambda ev, data: q.put((ev, data)))
    result = None
    while True:
        ev, data = q.get(timeout=timeout_s)
        if ev == "result":
            result = data
        elif ev == "error":
            raise data
        elif ev == "end":
            return result
