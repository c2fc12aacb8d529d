"""Guards on a streaming response: a cancel shuts its socket at once, silence shuts it too.

A read blocked on a slow server (a long prefill) returns the moment the socket is shut, so
a cancel takes effect within a poll instead of at the next token, and every engine (MLC,
vLLM, Ollama, llama-server…) stops generating when its client goes away.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from localrun.types import Cancel

log = logging.getLogger(__name__)

#: How often a cancel watcher looks at the flag; also the worst-case cancel latency.
CANCEL_POLL_S = 0.01
WATCH_POLL_S = 0.02


# --- cancelling a blocked read --------------------------------------------------------


def shutdown_response(response: httpx.Response) -> None:
    """Wake a thread blocked reading ``response``: shut its socket, then close it."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError as exc:  # already closed by the server: nothing left to wake
            log.debug("socket shutdown on cancel: %s", exc)
    else:
        response.close()


@contextlib.contextmanager
def abort_on_cancel(response: httpx.Response, cancel: Cancel) -> Iterator[None]:
    """While the block runs, a set ``cancel`` shuts the response's connection.

    The reader then sees the stream end or break; callers check ``cancel.is_set()`` to
    tell that apart from a server that went away.
    """
    done = threading.Event()

    def watch() -> None:
        while not done.wait(CANCEL_POLL_S):
            if cancel.is_set():
                shutdown_response(response)
                return

    watcher = threading.Thread(target=watch, name="cancel-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()


# --- one watchdog thread per client ------------------------------------------------


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 5.0
    first_byte_s: float = 120.0
    chunk_s: float = 60.0


class Watchdog:
    """One stream's guard: shut it when the request is cancelled or the upstream goes quiet."""

    def __init__(self, response: httpx.Response, cancel: Cancel, timeouts: Timeouts, started: float, hub: WatchHub):
        self.response, self.cancel, self.timeouts = response, cancel, timeouts
        self.started = started
        self.last_event: float | None = None
        self.fired: str | None = None  # "first byte" | "between chunks" once it shut the stream
        self._hub = hub
        hub.add(self)

    def event(self) -> None:
        self.last_event = time.monotonic()

    def check(self, now: float) -> bool:
        """Shut the stream if it is due; True once this guard has nothing more to do."""
        if self.cancel.is_set():
            shutdown_response(self.response)
            return True
        if self.last_event is None and now - self.started > self.timeouts.first_byte_s:
            self.fired = "first byte"
        elif self.last_event is not None and now - self.last_event > self.timeouts.chunk_s:
            self.fired = "between chunks"
        if self.fired:
            shutdown_response(self.response)
            return True
        return False

    def stop(self) -> None:
        self._hub.remove(self)


class WatchHub:
    """One thread per upstream client checks all its open streams (not a thread per request)."""

    def __init__(self) -> None:
        self._items: set[Watchdog] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, w: Watchdog) -> None:
        with self._lock:
            self._items.add(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="upstream-watch", daemon=True)
                self._thread.start()

    def remove(self, w: Watchdog) -> None:
        with self._lock:
            self._items.discard(w)

    def _run(self) -> None:
        idle = 0
        while True:
            time.sleep(WATCH_POLL_S)
            with self._lock:
                items = list(self._items)
                if not items:
                    idle += 1
                    if idle * WATCH_POLL_S >= 2.0:  # nothing open for a while: the thread ends
                        self._thread = None
                        return
                    continue
            idle = 0
            now = time.monotonic()
            for w in items:
                if w.check(now):
                    self.remove(w)
