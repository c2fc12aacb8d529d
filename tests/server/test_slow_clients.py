"""Slow clients are cut at the read deadlines while a normal client is answered meanwhile.

200 raw sockets against a real server process: a third send their request head a header line at a
time (some send nothing at all), a third a declared body a byte at a time, a third a chunked body
that never ends. Before the deadlines, all of them were held for as long as they kept trickling
(150 were still open after 21 s), a cheap way to exhaust the server. The test runs with
deadlines of a few seconds (``server.header_timeout_s``, ``server.body_timeout_s``).
"""

from __future__ import annotations

import selectors
import socket
import time

import httpx
import pytest

from tests.support import servers

HEAD_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 1.0
CLIENTS = 200
TRICKLE_S = 0.25
#: How long past its deadline a connection may stay open on a busy shared machine.
SLACK_S = 15.0


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_gguf):
    home = tmp_path_factory.mktemp("slow-home")
    servers.import_model(home, tiny_gguf, "tiny")
    spec = servers.launcher(servers.free_port(), home=home)
    spec.env.update(
        LOCALRUN_SERVER__HEADER_TIMEOUT_S=str(HEAD_TIMEOUT_S),
        LOCALRUN_SERVER__BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        LOCALRUN_SERVER__KEEP_ALIVE_TIMEOUT_S=str(KEEP_ALIVE_S),
    )
    proc = servers.start(spec, home / "server.log")
    yield proc
    proc.stop()


class SlowClient:
    """One raw connection and what it trickles; ``closed_at`` is when the server hung up."""

    def __init__(self, port: int, kind: str, index: int):
        self.kind = kind
        self.index = index
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setblocking(False)
        self.received = b""
        self.closed_at: float | None = None
        self.sent_lines = 0
        head = f"POST /api/generate HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: application/json\r\n"
        if kind == "body":
            self._send(head + "Content-Length: 100000\r\n\r\n{")
        elif kind == "chunks":
            self._send(head + "Transfer-Encoding: chunked\r\n\r\n")
        elif index % 5:  # a slow head; every fifth of these sends nothing at all
            self._send(head)

    def _send(self, text: str) -> None:
        try:
            self.sock.send(text.encode())
        except (BrokenPipeError, ConnectionResetError, BlockingIOError):
            self.hang_up()

    def trickle(self) -> None:
        """One more piece of what never completes."""
        if self.closed_at is not None:
            return
        self.sent_lines += 1
        if self.kind == "head" and self.index % 5:
            self._send(f"X-Slow-{self.sent_lines}: still coming\r\n")
        elif self.kind == "body":
            self._send(" ")
        elif self.kind == "chunks":
            self._send("1\r\nx\r\n")

    def readable(self) -> None:
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BlockingIOError):
            data = b""
        if data:
            self.received += data
        else:
            self.hang_up()

    def hang_up(self) -> None:
        if self.closed_at is None:
            self.closed_at = time.monotonic()


def test_slow_clients_are_cut_at_the_deadline_and_a_normal_client_is_answered(server):
    port = server.spec.port
    kinds = ("head", "body", "chunks")
    started = time.monotonic()
    clients = [SlowClient(port, kinds[i % 3], i) for i in range(CLIENTS)]
    selector = selectors.DefaultSelector()
    for client in clients:
        selector.register(client.sock, selectors.EVENT_READ, client)
    answered = None
    try:
        deadline = started + max(HEAD_TIMEOUT_S, BODY_TIMEOUT_S) + SLACK_S
        next_trickle = started
        while time.monotonic() < deadline and any(c.closed_at is None for c in clients):
            now = time.monotonic()
            if now >= next_trickle:
                for client in clients:
                    client.trickle()
                next_trickle = now + TRICKLE_S
            if answered is None and now - started > 0.5:  # all 200 are held open now
                health = httpx.get(f"{server.url}/health", timeout=10)
                body = {"model": "tiny", "prompt": "hi", "stream": False}
                generate = httpx.post(f"{server.url}/api/generate", json=body, timeout=10)
                answered = (health.status_code, generate.status_code, time.monotonic())
            for key, _ in selector.select(timeout=0.05):
                client = key.data
                client.readable()
                if client.closed_at is not None:
                    selector.unregister(client.sock)
    finally:
        selector.close()
        for client in clients:
            client.sock.close()

    assert answered is not None and answered[:2] == (200, 200)
    open_when_answered = sum(1 for c in clients if c.closed_at is None or c.closed_at > answered[2])
    assert open_when_answered == CLIENTS  # the normal client did not wait for the slow ones to go
    still_open = [c.kind for c in clients if c.closed_at is None]
    assert not still_open, f"{len(still_open)} slow clients still open: {sorted(set(still_open))}"
    for client in clients:
        held = client.closed_at - started
        limit = HEAD_TIMEOUT_S if client.kind == "head" else BODY_TIMEOUT_S
        assert held >= limit * 0.9, (client.kind, held)  # cut by the deadline, not before it
        assert b" 408 " in client.received.split(b"\r\n", 1)[0], (client.kind, client.received[:200])
    print(
        f"\n{CLIENTS} slow clients cut after {min(c.closed_at for c in clients) - started:.1f}–"
        f"{max(c.closed_at for c in clients) - started:.1f} s (deadlines {HEAD_TIMEOUT_S:g} s head, "
        f"{BODY_TIMEOUT_S:g} s body)"
    )


def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(server):
    """uvicorn's timeout_keep_alive, from server.keep_alive_timeout_s (1 s here; uvicorn's own is 5 s)."""
    with socket.create_connection(("127.0.0.1", server.spec.port), timeout=KEEP_ALIVE_S + 3.0) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: localhost:{server.spec.port}\r\n\r\n".encode())
        data = b""
        while b"}" not in data:
            data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 200")
        answered = time.monotonic()
        assert sock.recv(65536) == b""  # the server hung up: no further request came
        assert time.monotonic() - answered >= KEEP_ALIVE_S * 0.9


def test_a_request_head_that_arrives_in_time_is_served_in_pieces(server):
    """The head deadline is for the whole head, not each read: a head in a few quick pieces is fine."""
    with socket.create_connection(("127.0.0.1", server.spec.port), timeout=10) as sock:
        for piece in ("GET /hea", "lth HTTP/1.1\r\n", f"Host: localhost:{server.spec.port}\r\n", "\r\n"):
            sock.sendall(piece.encode())
            time.sleep(0.1)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
