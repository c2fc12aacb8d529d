"""A real HTTP server on 127.0.0.1 that answers with recorded engine responses or misbehaves.

Each route maps ``"METHOD /path"`` to a :class:`Reply`: a status and body (bytes), an SSE
body sent event by event, a body cut off mid-way (the connection dropped, as when a server
dies), or no answer at all (accepts, reads the request, then waits). It records every
request (path, headers, JSON body) so tests can check what localrun sent.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RECORDED = Path(__file__).parent / "recorded"


def recorded(name: str) -> bytes:
    return (RECORDED / name).read_bytes()


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    sse: bool = False  # send body's events one by one
    cut_after: int | None = None  # send this many events, then drop the connection
    hang: bool = False  # never answer
    hold_open: bool = False  # after the events, keep the connection open and silent
    headers: dict = field(default_factory=dict)


class Replay:
    def __init__(self, routes: dict[str, Reply], *, tls: tuple[str, str] | None = None):
        """``tls``: (certificate, key) PEM paths to serve HTTPS."""
        self.routes = routes
        self.requests: list[dict] = []
        self._release = threading.Event()
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                replay.requests.append(
                    {"method": method, "path": self.path, "headers": dict(self.headers), "body": body}
                )
                reply = replay.routes.get(f"{method} {self.path}")
                if reply is None:
                    reply = Reply(404, b'{"error": {"message": "no such route", "type": "invalid_request_error"}}')
                replay.answer(self, reply)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="replay", daemon=True)
        self.thread.start()

    def answer(self, handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        if reply.hang:
            self._release.wait(30)
            return
        handler.send_response(reply.status)
        handler.send_header("Content-Type", "text/event-stream" if reply.sse else reply.content_type)
        for k, v in reply.headers.items():
            handler.send_header(k, v)
        if not reply.sse:
            handler.send_header("Content-Length", str(len(reply.body)))
            handler.end_headers()
            handler.wfile.write(reply.body)
            return
        handler.send_header("Connection", "close")
        handler.end_headers()
        events = [e + b"\n\n" for e in reply.body.split(b"\n\n") if e.strip()]
        for i, event in enumerate(events):
            if reply.cut_after is not None and i >= reply.cut_after:
                handler.close_connection = True
                handler.connection.shutdown(2)
                return
            handler.wfile.write(event)
            handler.wfile.flush()
            time.sleep(0.005)
        if reply.hold_open:
            self._release.wait(30)

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


def chat_sse(words: list[str], *, model: str = "m", usage: bool = True) -> bytes:
    """An OpenAI-shaped chat stream (vLLM's order: role, tokens, finish, usage, [DONE])."""
    out = []

    def ev(obj):
        out.append(b"data: " + json.dumps(obj).encode() + b"\n\n")

    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}
    ev({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    for w in words:
        ev({**base, "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]})
    ev({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if usage:
        ev(
            {
                **base,
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": len(words), "total_tokens": 3 + len(words)},
            }
        )
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def models_json(*ids: str) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]}).encode()
