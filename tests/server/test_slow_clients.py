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


# Refused requests: the guards answer before reading the body, and that must not let the body hold the connection.

KEY = "refused-test-key"
REFUSED_DRAIN_S = 2.0
PER_ADDRESS_CAP = 8
REFUSED_CLIENTS = 100  # 20 of each refusal
#: Source addresses the refused clients spread over (loopback /8 on Linux), under the per-address cap.
SOURCES = [f"127.0.0.{10 + i}" for i in range(25)]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, tiny_gguf):
    home = tmp_path_factory.mktemp("refused-home")
    servers.import_model(home, tiny_gguf, "tiny")
    spec = servers.launcher(servers.free_port(), home=home, api_key=KEY)
    spec.env.update(
        LOCALRUN_SERVER__HEADER_TIMEOUT_S=str(HEAD_TIMEOUT_S),
        LOCALRUN_SERVER__BODY_TIMEOUT_S="30",  # the refused-body deadline must cut them, not this one
        LOCALRUN_SERVER__REFUSED_BODY_TIMEOUT_S=str(REFUSED_DRAIN_S),
        LOCALRUN_SERVER__MAX_BODY_BYTES="4096",
        LOCALRUN_SERVER__MAX_UNAUTHENTICATED_CONNECTIONS=str(PER_ADDRESS_CAP),
    )
    proc = servers.start(spec, home / "server.log")
    yield proc
    proc.stop()


def _connect(port: int, source: str | None) -> socket.socket:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0) if source else None)
    except OSError as exc:  # not Linux: only 127.0.0.1 is configured
        pytest.skip(f"cannot connect from {source}: {exc}")


class RefusedClient(SlowClient):
    """A request the server refuses before reading its body, whose body then trickles forever."""

    STATUS = {"401": b" 401 ", "403": b" 403 ", "413": b" 413 ", "415": b" 415 ", "preflight": b" 200 "}

    def __init__(self, port: int, kind: str, index: int):  # noqa: PLR0912 - one branch per refusal
        self.kind = kind
        self.index = index
        self.sock = _connect(port, SOURCES[index % len(SOURCES)])
        self.sock.setblocking(False)
        self.received = b""
        self.closed_at = None
        self.sent_lines = 0
        self.chunked = kind != "413" and index % 2 == 1
        method, host, extra = "POST", f"localhost:{port}", f"Authorization: Bearer {KEY}\r\n"
        ctype = "application/json"
        if kind == "401":
            extra = ""
        elif kind == "403":
            host = "evil.example"
        elif kind == "415":
            extra += "Origin: https://pages.example\r\n"  # a page CORS does not trust (a local one may post text/plain)
            ctype = "text/plain"
        elif kind == "preflight":
            method, extra = "OPTIONS", "Origin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\n"
        # Under the size limit (4096) but for the 413: the drain's deadline, not its size, must cut them.
        length = 100_000 if kind == "413" else 4000
        framing = "Transfer-Encoding: chunked" if self.chunked else f"Content-Length: {length}"
        head = f"{method} /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n"
        self._send(f"{head}{extra}{framing}\r\n\r\n")

    def trickle(self) -> None:
        if self.closed_at is None:
            self._send("1\r\nx\r\n" if self.chunked else "x")


def _watch(clients: list, seconds: float) -> float:
    """Trickle into every client until all are closed or ``seconds`` pass; when the watch began."""
    started = time.monotonic()
    selector = selectors.DefaultSelector()
    for client in clients:
        selector.register(client.sock, selectors.EVENT_READ, client)
    try:
        next_trickle = started
        while time.monotonic() < started + seconds and any(c.closed_at is None for c in clients):
            if time.monotonic() >= next_trickle:
                for client in clients:
                    client.trickle()
                next_trickle = time.monotonic() + TRICKLE_S
            for key, _ in selector.select(timeout=0.05):
                key.data.readable()
                if key.data.closed_at is not None:
                    selector.unregister(key.data.sock)
    finally:
        selector.close()
    return started


def test_refused_requests_that_trickle_a_body_are_cut(keyed):
    """401, 403, 413, 415 and preflights, half with a declared body and half chunked, 1 byte each 0.25 s.

    Before: every one was held for as long as it trickled (0 of 100 closed after the watch).
    """
    kinds = ("401", "403", "413", "415", "preflight")
    clients = [RefusedClient(keyed.spec.port, kinds[i % 5], i) for i in range(REFUSED_CLIENTS)]
    try:
        started = _watch(clients, REFUSED_DRAIN_S + SLACK_S)
    finally:
        for client in clients:
            client.sock.close()
    held = sorted({f"{c.kind}{'/chunked' if c.chunked else ''}" for c in clients if c.closed_at is None})
    assert not held, f"{sum(c.closed_at is None for c in clients)} refused clients still open: {held}"
    for client in clients:
        status_line = client.received.split(b"\r\n", 1)[0]
        assert RefusedClient.STATUS[client.kind] in status_line, (client.kind, client.received[:200])
        assert b"connection: close" in client.received.lower(), (client.kind, client.received[:300])
    closed = [c.closed_at - started for c in clients]
    print(f"\n{REFUSED_CLIENTS} refused clients cut after {min(closed):.1f}–{max(closed):.1f} s")


def test_a_refused_request_whose_body_comes_whole_keeps_its_connection(keyed):
    """The drain is what lets a well-behaved client keep its connection after a 401."""
    port = keyed.spec.port
    body = b'{"model": "tiny", "messages": []}'
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: application/json\r\n"
    with _connect(port, None) as sock:
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        first = _read_answer(sock)
        assert first.startswith(b"HTTP/1.1 401") and b"connection: close" not in first.lower()
        sock.sendall(_keyed_get(port, "/v1/models"))
        assert _read_answer(sock).startswith(b"HTTP/1.1 200")


def test_content_length_with_transfer_encoding_is_answered_then_closed(keyed):
    """RFC 9112 §6.3: a message with both framings may be a smuggling attempt; close after answering.
    Before: the chunked body won and the pipelined request behind it was served."""
    port = keyed.spec.port
    head = (
        f"POST /api/show HTTP/1.1\r\nHost: localhost:{port}\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    body = b'{"model":"tiny"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    pipelined = f"GET /health HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode()
    with _connect(port, None) as sock:
        sock.sendall(head.encode() + chunked + pipelined)
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer.lower()
    assert answer.count(b"HTTP/1.1 ") == 1, answer[:600]  # the pipelined request was not served


def test_an_address_holds_a_bounded_number_of_connections_without_the_key(keyed):
    port = keyed.spec.port
    source = "127.0.0.77"
    held = [_connect(port, source) for _ in range(PER_ADDRESS_CAP)]
    try:
        with _connect(port, source) as extra:
            assert _read_until_closed(extra).startswith(b"HTTP/1.1 429")
        held.pop().close()
        time.sleep(0.2)
        with _connect(port, source) as keyed_client:  # a slot is free: this one shows the key
            keyed_client.sendall(_keyed_get(port, "/v1/models"))
            assert _read_answer(keyed_client).startswith(b"HTTP/1.1 200")
            more = [_connect(port, source) for _ in range(2)]  # the address showed the key: no cap now
            for sock in more:
                sock.sendall(f"GET /health HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())
                assert _read_answer(sock).startswith(b"HTTP/1.1 200")
                sock.close()
    finally:
        for sock in held:
            sock.close()


def _keyed_get(port: int, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()


def _read_answer(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return data


def _read_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data
