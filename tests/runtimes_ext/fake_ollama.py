"""A small Ollama server for tests: the documented HTTP API (docs/api.md) on 127.0.0.1.

It speaks NDJSON over chunked HTTP/1.1 like Ollama, applies ``num_predict`` and ``stop``
server-side, answers 404 ``{"error": …}`` for unknown models, and notices when a client
drops a stream (``disconnects``), so tests can prove a cancel stopped the generation.
Every request body is kept in ``requests`` for assertions. The official ``ollama`` client
is run against it in the tests, which keeps it honest.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.runtimes_ext import fakegen

VERSION = "0.12.3"
PULLABLE = {"tinyllama:latest": 3_000, "nomic-embed-text:latest": 1_500}


@dataclass
class FakeModel:
    name: str
    size: int = 1_000
    capabilities: tuple[str, ...] = ("completion",)
    family: str = "llama"


@dataclass
class FakeOllamaState:
    models: dict[str, FakeModel] = field(default_factory=dict)
    loaded: dict[str, float] = field(default_factory=dict)  # name -> expires_at (epoch s)
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    disconnects: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # handler failures other than hang-ups
    token_delay_s: float = 0.0
    max_stream_tokens: int = 100_000
    lock: threading.Lock = field(default_factory=threading.Lock)

    def find(self, name: str) -> FakeModel | None:
        return self.models.get(name) or self.models.get(f"{name}:latest")


def _details(m: FakeModel) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf", "family": m.family, "families": [m.family],
            "parameter_size": "1M", "quantization_level": "Q4_K_M"}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "FakeOllama"

    def log_message(self, fmt: str, *args: Any) -> None:  # keep test output clean
        pass

    # -- plumbing ------------------------------------------------------------------------
    @property
    def state(self) -> FakeOllamaState:
        return self.server.state

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _missing(self, name: str) -> None:
        self._json(404, {"error": f"model '{name}' not found"})

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _line(self, data: dict[str, Any]) -> None:
        raw = json.dumps(data).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        data = json.loads(self.rfile.read(n) or b"{}")
        with self.state.lock:
            self.state.requests.append((self.path, data))
        return data

    # -- routes --------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if self.path == "/":
            body = b"Ollama is running"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        elif self.path == "/api/version":
            self._json(200, {"version": VERSION})
        elif self.path == "/api/tags":
            self._json(200, {"models": [
                {"name": m.name, "model": m.name, "modified_at": _now(), "size": m.size,
                 "digest": "0" * 64, "details": _details(m)} for m in self.state.models.values()]})
        elif self.path == "/api/ps":
            now = time.time()
            self._json(200, {"models": [
                {"name": n, "model": n, "size": self.state.models[n].size, "digest": "0" * 64,
                 "details": _details(self.state.models[n]), "size_vram": 0,
                 "expires_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp if exp > 0 else now + 1e6))}
                for n, exp in self.state.loaded.items() if n in self.state.models]})
        else:
            self._json(404, {"error": "404 page not found"})

    def do_POST(self) -> None:
        routes = {"/api/show": self._show, "/api/pull": self._pull, "/api/chat": self._chat,
                  "/api/generate": self._generate, "/api/embed": self._embed}
        handler = routes.get(self.path)
        if handler is None:
            self._json(404, {"error": "404 page not found"})
            return
        handler(self._body())

    def _show(self, body: dict[str, Any]) -> None:
        m = self.state.find(body.get("model", ""))
        if m is None:
            return self._missing(body.get("model", ""))
        self._json(200, {"modelfile": f"FROM {m.name}", "parameters": "", "template": "{{ .Prompt }}",
                         "details": _details(m), "model_info": {"general.architecture": m.family},
                         "capabilities": list(m.capabilities), "modified_at": _now()})

    def _pull(self, body: dict[str, Any]) -> None:
        name = body.get("model", "")
        full = name if ":" in name else f"{name}:latest"
        self._start_stream()
        self._line({"status": "pulling manifest"})
        if full not in PULLABLE:
            self._line({"error": "pull model manifest: file does not exist"})
            return self._end_stream()
        total = PULLABLE[full]
        for done in range(0, total + 1, total // 3):
            self._line({"status": "pulling abc123", "digest": "sha256:abc123", "total": total, "completed": done})
        for status in ("verifying sha256 digest", "writing manifest", "success"):
            self._line({"status": status})
        with self.state.lock:
            caps = ("embedding",) if "embed" in full else ("completion",)
            self.state.models[full] = FakeModel(full, size=total, capabilities=caps)
        self._end_stream()

    def _keep_alive(self, name: str, keep_alive: Any) -> None:
        with self.state.lock:
            if keep_alive in (0, "0", "0s"):
                self.state.loaded.pop(name, None)
            else:
                self.state.loaded[name] = time.time() + 300 if keep_alive not in (-1, "-1") else -1

    def _chat(self, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        prompt = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)
        self._run(body, prompt, chat=True, empty=not messages)

    def _generate(self, body: dict[str, Any]) -> None:
        self._run(body, body.get("prompt") or "", chat=False, empty=not body.get("prompt"))

    def _run(self, body: dict[str, Any], prompt: str, *, chat: bool, empty: bool) -> None:
        name = body.get("model", "")
        m = self.state.find(name)
        if m is None:
            return self._json(404, {"error": f'model "{name}" not found, try pulling it first'})
        if "completion" not in m.capabilities:  # Ollama's answer for an embedding-only model
            return self._json(400, {"error": f'"{name}" does not support {"chat" if chat else "generate"}'})
        self._keep_alive(m.name, body.get("keep_alive", "5m"))
        base = {"model": name, "created_at": _now()}
        if empty:  # load or unload only
            reason = "unload" if body.get("keep_alive") in (0, "0", "0s") else "load"
            done = {**base, "done": True, "done_reason": reason}
            done.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
            return self._json(200, done)
        options = body.get("options") or {}
        num_predict = options.get("num_predict")
        limit = None if num_predict is None or num_predict < 0 else num_predict
        limit = min(limit, self.state.max_stream_tokens) if limit is not None else self.state.max_stream_tokens
        pieces = fakegen.generate(prompt, seed=options.get("seed"), max_tokens=limit, stops=options.get("stop") or ())

        def frame(text: str) -> dict[str, Any]:
            return {**base, "done": False, **({"message": {"role": "assistant", "content": text}} if chat else {"response": text})}

        texts, reason, n = [], "stop", 0
        stream = body.get("stream", True)
        try:
            if stream:
                self._start_stream()
            for text, finish in pieces:
                if finish is not None:
                    reason = finish
                    break
                n += 1
                texts.append(text)
                if stream:
                    if self.state.token_delay_s:
                        time.sleep(self.state.token_delay_s)
                    self._line(frame(text))
            usage = {"prompt_eval_count": fakegen.count_tokens(prompt), "eval_count": n,
                     "total_duration": 1000, "load_duration": 10, "prompt_eval_duration": 100, "eval_duration": 800}
            final = {**frame("" if stream else "".join(texts)), "done": True, "done_reason": reason, **usage}
            if stream:
                self._line(final)
                self._end_stream()
            else:
                self._json(200, final)
        except (BrokenPipeError, ConnectionResetError):
            with self.state.lock:
                self.state.disconnects.append(name)
            self.close_connection = True

    def _embed(self, body: dict[str, Any]) -> None:
        name = body.get("model", "")
        m = self.state.find(name)
        if m is None:
            return self._missing(name)
        if "embedding" not in m.capabilities:
            return self._json(400, {"error": f'"{name}" does not support embeddings'})
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
        self._json(200, {"model": name, "embeddings": [fakegen.embedding(t) for t in inputs],
                         "total_duration": 10, "load_duration": 1, "prompt_eval_count": len(inputs)})


class FakeOllama(ThreadingHTTPServer):
    """``with FakeOllama() as srv:`` serves on ``srv.url`` from a background thread."""

    daemon_threads = True

    def __init__(self, models: list[FakeModel] | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = FakeOllamaState(models={m.name: m for m in (models or [])})
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up is normal here (cancel tests); anything else is kept."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            return
        self.state.errors.append(repr(exc))
        super().handle_error(request, client_address)

    def __enter__(self) -> "FakeOllama":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.server_close()
