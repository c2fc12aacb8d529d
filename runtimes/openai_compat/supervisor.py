"""The supervised engine server: an OpenAI-compatible engine (``mlc_llm serve``, vLLM) that
localrun starts as a subprocess, one per loaded model, and speaks to over HTTP.

MLC (:mod:`localrun.runtimes.mlc`) and vLLM (:mod:`localrun.runtimes.vllm`) differ only in the
command line, the name, the start timeout and the environment; both build on
:class:`SupervisedServer` and :class:`SupervisedSession`, so neither borrows the other's classes.
Each server runs in its own process group on a free loopback port, so a crash in the engine
takes down only that model: the request it was serving gets
:class:`~localrun.errors.WorkerCrashed`, and the next request starts it again (a few times,
then the model is reported unavailable).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from localrun.errors import LocalrunError, RuntimeUnavailable, WorkerCrashed
from localrun.proc import describe_exit
from localrun.runtimes.openai_compat.client import OpenAIClient
from localrun.runtimes.openai_compat.watch import Timeouts
from localrun.runtimes.pieces import Piece, shape_stream
from localrun.types import Cancel, Chunk, ModelRecord, Plan

log = logging.getLogger(__name__)

#: How many times a session starts its server again after it died, before giving up.
MAX_RESTARTS = 3


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class SupervisedServer:
    """One engine server process: started on a free loopback port, waited for, stopped, its log kept.

    Subclasses say how to start it (:meth:`serve_command`), how it is named (``label``) and which
    plan option bounds its start (``timeout_option``); the rest is the same for every engine.
    """

    def __init__(self, record: ModelRecord, plan: Plan, *, log_path: Path):
        self.record = record
        self.plan = plan
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: OpenAIClient | None = None
        self.model_id = str(record.path)
        self.port: int | None = None

    #: How the server is named in logs and errors.
    label: ClassVar[str] = "engine server"
    #: The plan option that bounds the start, and its default (a first run may compile).
    timeout_option: ClassVar[str] = "start_timeout_s"
    default_start_timeout_s: ClassVar[float] = 300.0

    def serve_command(self, port: int) -> list[str]:
        raise NotImplementedError

    def start_timeout_s(self) -> float:
        return float(self.plan.options.get(self.timeout_option, self.default_start_timeout_s))

    def spawn_env(self) -> dict[str, str] | None:
        return None  # the parent's environment

    def start(self) -> None:
        """Start the server and wait for ``/v1/models``; retry once if the port was taken."""
        timeout_s = self.start_timeout_s()
        for attempt in range(2):
            port = _free_port()
            cmd = self.serve_command(port)
            self.port = port
            self._spawn(cmd)
            read = float(self.plan.options.get("read_timeout_s", 600.0))
            self.client = OpenAIClient(
                f"http://127.0.0.1:{port}", server=f"{self.label} on port {port}", timeouts=Timeouts(5.0, read, read)
            )
            try:
                self._wait_ready(timeout_s)
                return
            except RuntimeUnavailable:
                self.stop()
                if attempt == 0 and "address already in use" in self.log_tail().lower():
                    continue
                raise

    def _spawn(self, cmd: list[str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting %s", shlex.join(cmd))
        with open(self.log_path, "ab") as log_file:  # the child keeps its own descriptor
            log_file.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n".encode())
            log_file.flush()
            kwargs: dict[str, Any] = (
                {"start_new_session": True}
                if os.name == "posix"
                else {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
            )
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=self.spawn_env(), **kwargs
            )

    def started(self) -> tuple[subprocess.Popen[bytes], OpenAIClient]:
        """The process and its client; a session talks only to a server :meth:`start` started."""
        if self.proc is None or self.client is None:
            raise RuntimeUnavailable(f"{self.label} for {self.record.name} was never started")
        return self.proc, self.client

    def _wait_ready(self, timeout_s: float) -> None:
        proc, client = self.started()
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            code = proc.poll()
            if code is not None:
                raise RuntimeUnavailable(
                    f"{self.label} exited ({code}) before it was ready for {self.record.name}:\n{self.log_tail()}",
                    hint=f"full log: {self.log_path}",
                )
            try:
                ids = [m["id"] for m in client.models(timeout_s=2.0)]
            except LocalrunError:
                ids = None
            if ids is not None:
                self.model_id = ids[0] if ids else self.model_id
                return
            if time.monotonic() > deadline:
                raise RuntimeUnavailable(
                    f"{self.label} did not answer within {timeout_s:.0f} s for {self.record.name}:\n{self.log_tail()}",
                    hint=f"a first run may compile or warm up the model; raise {self.timeout_option}. "
                    f"Full log: {self.log_path}",
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def exit_text(self) -> str | None:
        """None while running, else how the process ended."""
        if self.proc is None:
            return "not started"
        code = self.proc.poll()
        return None if code is None else describe_exit(code)

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 16384))
                text = f.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.client is not None:
            self.client.close()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGTERM)  # the whole group: MLC may start helpers
            else:
                proc.terminate()
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %s) ignored SIGTERM for %.0f s; killing it", self.label, proc.pid, timeout_s)
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait()
        except ProcessLookupError:
            proc.wait()


class SupervisedSession:
    """One model behind one supervised server, which batches concurrent requests itself.

    A server that died is started again on the next request (``MAX_RESTARTS`` times); a stream
    that breaks because it died becomes :class:`~localrun.errors.WorkerCrashed` with its log.
    """

    concurrent = True
    capabilities: frozenset[str] = frozenset()
    #: Errors that mean the server may have died under the request.
    lost: tuple[type[Exception], ...] = (WorkerCrashed, RuntimeUnavailable)

    def __init__(self, server: SupervisedServer):
        self._server = server
        self._restarts = 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def alive(self) -> bool:
        return not self._closed and self._server.exit_text() is None

    def _ensure_running(self) -> None:
        """Start the server again after a crash, a bounded number of times."""
        with self._lock:
            if self._closed:
                raise RuntimeUnavailable(f"{self._server.record.name} is unloaded")
            status = self._server.exit_text()
            if status is None:
                return
            if self._restarts >= MAX_RESTARTS:
                raise RuntimeUnavailable(
                    f"{self._server.label} for {self._server.record.name} stopped ({status}) "
                    f"{self._restarts + 1} times",
                    hint=f"see {self._server.log_path}",
                )
            self._restarts += 1
            log.warning(
                "%s for %s stopped (%s); starting it again", self._server.label, self._server.record.name, status
            )
            self._server.stop()
            self._server.start()

    def _guard(self, pieces: Generator[Piece, None, None]) -> Iterator[Piece]:
        """A stream that breaks because the server died becomes WorkerCrashed with its log."""
        try:
            yield from pieces
        except self.lost as exc:
            try:
                self._server.started()[0].wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            status = self._server.exit_text()
            if status is None and not isinstance(exc, WorkerCrashed):
                raise
            raise WorkerCrashed(
                f"{self._server.label} running {self._server.record.name} stopped ({status or 'connection lost'}) "
                f"during the request:\n{self._server.log_tail(10)}",
                hint=f"retry; the next request starts it again. Full log: {self._server.log_path}",
            ) from exc
        finally:
            pieces.close()

    def _stream(self, path: str, body: dict[str, Any], stops: Sequence[str], cancel: Cancel) -> Iterator[Chunk]:
        """POST ``body`` (the model id added) and shape the answer; the server is started again if it died."""
        self._ensure_running()
        client, model = self._server.started()[1], self._server.model_id
        pieces = self._guard(client.stream(path, {"model": model, **body}, cancel, model=self._server.record.name))
        return shape_stream(pieces, stops=stops, cancel=cancel)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._server.stop()
