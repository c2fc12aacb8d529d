"""The loop inside a worker process: load one model, then serve requests until told to stop.

Requests run one at a time on a request thread, in arrival order, unless the session
declares ``concurrent = True`` (a batching scheduler): then each request gets its own
thread and the session interleaves them. The reading loop stays free to take ``cancel``
at any moment; a cancel sets the request's flag, which the session polls every step.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Any, BinaryIO

from localrun.errors import LocalrunError
from localrun.frames import Frame, FrameWriter, read_frame
from localrun.runtimes.base import Session
from localrun.types import Cancel, Chunk, ModelRecord, Plan
from localrun.worker import ops

log = logging.getLogger(__name__)


def _error_dict(exc: BaseException) -> dict[str, Any]:
    """The error event's body, its texts made encodable: a message that quotes the request's own
    text may hold a lone surrogate, and an error event that cannot be sent leaves the parent
    waiting on a request that is over."""
    data = (
        exc.to_dict()
        if isinstance(exc, LocalrunError)
        else {"kind": "LocalrunError", "message": f"{type(exc).__name__}: {exc}", "hint": None, "param": None}
    )
    return {k: _encodable(v) if isinstance(v, str) else v for k, v in data.items()}


#: The longest text an error event carries: a message quoting a huge input must still fit a frame,
#: or the parent would wait on a request that is over.
_MAX_ERROR_TEXT = 16 * 1024


def _encodable(text: str) -> str:
    if len(text) > _MAX_ERROR_TEXT:
        text = f"{text[:_MAX_ERROR_TEXT]}… ({len(text) - _MAX_ERROR_TEXT} more characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class WorkerServer:
    def __init__(self, writer: FrameWriter) -> None:
        self.writer = writer
        self.session: Session | None = None
        self.runtime = "this"  # the runtime's name, once loaded: errors of a missing extra name it
        self.cancels: dict[int, Cancel] = {}
        self.jobs: queue.Queue[Frame | None] = queue.Queue()

    def load(self, msg: dict[str, Any]) -> None:
        from localrun.runtimes import get_runtime

        try:
            runtime = get_runtime(msg["runtime"])
            self.runtime = msg["runtime"]
            self.session = runtime.load(ModelRecord.from_dict(msg["record"]), Plan.from_dict(msg["plan"]))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
            log.debug("load failed", exc_info=True)
            self.writer.send({"ev": "load_error", "error": _error_dict(exc)})
            raise SystemExit(3) from None
        info = {"pid": os.getpid(), "capabilities": sorted(getattr(self.session, "capabilities", ()))}
        self.writer.send({"ev": "ready", "info": info})

    def run_request(self, frame: Frame) -> None:
        msg, payloads = frame
        rid = msg["id"]
        cancel = self.cancels.setdefault(rid, Cancel())
        try:
            request = ops.from_frame(msg, payloads)
            send = self.writer.send
            if self.session is None:
                raise RuntimeError("no model is loaded")

            def emit(chunk: Chunk) -> None:
                send({"ev": "chunk", "id": rid, "c": chunk.to_dict()})

            result = ops.run(self.session, request, cancel, emit, runtime=self.runtime)
            if not ops.streams(request):
                send({"ev": "result", "id": rid, "data": result})
            send({"ev": "end", "id": rid})
        except BaseException as exc:  # noqa: BLE001 - every failure becomes the request's error event
            log.debug("request %s failed", rid, exc_info=True)
            self.writer.send({"ev": "error", "id": rid, "error": _error_dict(exc)})
        finally:
            self.cancels.pop(rid, None)

    def serial_loop(self) -> None:
        while True:
            frame = self.jobs.get()
            if frame is None:
                return
            self.run_request(frame)

    def serve(self, stdin: BinaryIO) -> int:
        concurrent = bool(getattr(self.session, "concurrent", False))
        if not concurrent:
            threading.Thread(target=self.serial_loop, name="requests", daemon=True).start()
        while True:
            frame = read_frame(stdin)
            if frame is None or frame[0].get("op") == "shutdown":
                break
            msg = frame[0]
            op = msg.get("op")
            if op == "cancel":
                cancel = self.cancels.get(msg["id"])
                if cancel is not None:  # else the request already ended: nothing to stop
                    cancel.set()
            elif op in ops.OPS:
                self.cancels.setdefault(msg["id"], Cancel())
                if concurrent:
                    threading.Thread(target=self.run_request, args=(frame,), daemon=True).start()
                else:
                    self.jobs.put(frame)
        for c in list(self.cancels.values()):
            c.set()
        return 0


def serve(stdin: BinaryIO, stdout: BinaryIO) -> int:
    level = os.environ.get("LOCALRUN_WORKER_LOG", "WARNING").upper()
    logging.basicConfig(level=level, format="worker %(process)d %(levelname)s %(name)s: %(message)s")
    writer = FrameWriter(stdout)
    server = WorkerServer(writer)
    first = read_frame(stdin)
    if not first or first[0].get("op") != "load":
        return 2
    server.load(first[0])
    code = server.serve(stdin)
    session = server.session
    if session is not None:
        try:
            session.close()
        except Exception:  # noqa: BLE001 - the process is ending; log and exit anyway
            log.warning("closing the session failed", exc_info=True)
    # Skip interpreter teardown: native libraries sometimes crash in their destructors.
    os._exit(code)
