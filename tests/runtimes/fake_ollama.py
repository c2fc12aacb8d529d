"""A small Ollama server for tests: the documented HTTP API (docs/api.md) on 127.0.0.1.

It speaks NDJSON over chunked HTTP/1.1 like Ollama, applies ``num_predict`` and ``stop``
server-side, answers 404 ``{"error": …}`` for unknown models, and notices when a client
drops a stream (``disconnects``), so tests can prove a cancel stopped the generation.
Every request body is kept in ``requests`` for assertions. The official ``ollama`` client
is run against it in the tests, which keeps it honest.

The optional features behave as Ollama's do, deterministically:

* ``tools``: refused (400) for a model whose capabilities lack "tools"; when the last
  message is the user's and says ``call NAME`` for one of the tools, the answer is a chunk whose
  ``message.tool_calls`` holds that call, arguments an object valid for the function's
  parameters (with ``id`` and ``index`` as newer Ollama sends them, unless
  ``tool_call_ids`` is off), then ``done`` with ``done_reason`` "stop". History turns are
  decoded as Ollama's Go types decode them: call arguments must be objects.
* ``format``: ``"json"`` gives a JSON object, a schema gives an instance of it, streamed a
  few characters at a time (``num_predict`` cuts it like any answer); any other string is
  a 400, and so is a schema object on a version before 0.5.0 (``format`` was a string).
* ``logprobs`` / ``top_logprobs``: each text chunk carries one entry ``{"token", "logprob",
  "bytes", "top_logprobs"}`` (alternatives left out when none are asked); the non-streamed
  answer carries them all. A version before 0.12.11 ignores the fields, as Ollama did.

``state.version`` is what ``/api/version`` answers, so tests can play an older Ollama.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.runtimes import fakegen

VERSION = "0.13.0"
MIN_FORMAT_SCHEMA = (0, 5, 0)
MIN_LOGPROBS = (0, 12, 11)
PULLABLE = {"tinyllama:latest": 3_000, "nomic-embed-text:latest": 1_500}


@dataclass
class FakeModel:
    name: str
    size: int = 1_000
    capabilities: tuple[str, ...] | None = ("completion",)  # None: an Ollama before 0.6 sends no list
    family: str = "llama"

    @property
    def caps(self) -> tuple[str, ...]:
        """What the model can do (a model from before the list could only complete)."""
        return ("completion",) if self.capabilities is None else self.capabilities


@dataclass
class FakeOllamaState:
    models: dict[str, FakeModel] = field(default_factory=dict)
    loaded: dict[str, float] = field(default_factory=dict)  # name -> expires_at (epoch s)
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    disconnects: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # handler failures other than hang-ups
    token_delay_s: float = 0.0
    max_stream_tokens: int = 100_000
    version: str | None = VERSION  # None: /api/version answers 404, as behind a proxy that hides it
    tool_call_ids: bool = True  # newer Ollama sends an id and index with each call
    lock: threading.Lock = field(default_factory=threading.Lock)

    def find(self, name: str) -> FakeModel | None:
        return self.models.get(name) or self.models.get(f"{name}:latest")


def _details(m: FakeModel) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": m.family,
        "families": [m.family],
        "parameter_size": "1M",
        "quantization_level": "Q4_K_M",
    }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeOllama

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
        elif self.path == "/api/version" and self.state.version is not None:
            self._json(200, {"version": self.state.version})
        elif self.path == "/api/tags":
            self._json(
                200,
                {
                    "models": [
                        {
                            "name": m.name,
                            "model": m.name,
                            "modified_at": _now(),
                            "size": m.size,
                            "digest": "0" * 64,
                            "details": _details(m),
                        }
                        for m in self.state.models.values()
                    ]
                },
            )
        elif self.path == "/api/ps":
            now = time.time()
            self._json(
                200,
                {
                    "models": [
                        {
                            "name": n,
                            "model": n,
                            "size": self.state.models[n].size,
                            "digest": "0" * 64,
                            "details": _details(self.state.models[n]),
                            "size_vram": 0,
                            "expires_at": time.strftime(
                                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp if exp > 0 else now + 1e6)
                            ),
                        }
                        for n, exp in self.state.loaded.items()
                        if n in self.state.models
                    ]
                },
            )
        else:
            self._json(404, {"error": "404 page not found"})

    def do_POST(self) -> None:
        routes = {
            "/api/show": self._show,
            "/api/pull": self._pull,
            "/api/chat": self._chat,
            "/api/generate": self._generate,
            "/api/embed": self._embed,
        }
        handler = routes.get(self.path)
        if handler is None:
            self._json(404, {"error": "404 page not found"})
            return
        handler(self._body())

    def _show(self, body: dict[str, Any]) -> None:
        m = self.state.find(body.get("model", ""))
        if m is None:
            return self._missing(body.get("model", ""))
        shown = {
            "modelfile": f"FROM {m.name}",
            "parameters": "",
            "template": "{{ .Prompt }}",
            "details": _details(m),
            "model_info": {"general.architecture": m.family},
            "modified_at": _now(),
        }
        if m.capabilities is not None:
            shown["capabilities"] = list(m.capabilities)
        self._json(200, shown)

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

    def _refusal(self, body: dict[str, Any], m: FakeModel, *, chat: bool) -> str | None:
        """Ollama's 400 for a body it cannot take, or None."""
        fmt = body.get("format")
        if isinstance(fmt, str) and fmt not in ("", "json"):
            return f'invalid format: "{fmt}"; expected "json" or a valid JSON Schema'
        if isinstance(fmt, dict) and _version(self.state.version) < MIN_FORMAT_SCHEMA:
            return "json: cannot unmarshal object into Go struct field GenerateRequest.format of type string"
        if chat and body.get("tools") and "tools" not in m.caps:
            return f"registry.ollama.ai/library/{m.name} does not support tools"
        for msg in body.get("messages") or ():
            for call in msg.get("tool_calls") or ():
                if not isinstance((call.get("function") or {}).get("arguments"), dict):
                    return (
                        "json: cannot unmarshal string into Go struct field "
                        "ToolCallFunction.messages.tool_calls.function.arguments of type map[string]interface {}"
                    )
        return None

    def _tool_calls(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The call the last message asks for ("call NAME") when it is the user's and NAME is
        one of the tools; after a tool result the model answers in words."""
        last = (body.get("messages") or [{}])[-1]
        said = re.search(r"\bcall\s+([\w.-]+)", last.get("content") or "") if last.get("role") == "user" else None
        by_name = {(t.get("function") or {}).get("name"): t.get("function") or {} for t in body.get("tools") or ()}
        if not said or said.group(1) not in by_name:
            return []
        fn = by_name[said.group(1)]
        call: dict[str, Any] = {"function": {"name": fn["name"], "arguments": instance(fn.get("parameters") or {})}}
        if self.state.tool_call_ids:
            call = {
                "id": "call_" + format(zlib.crc32(fn["name"].encode()), "08x"),
                "function": {"index": 0, **call["function"]},
            }
        return [call]

    def _run(self, body: dict[str, Any], prompt: str, *, chat: bool, empty: bool) -> None:
        name = body.get("model", "")
        m = self.state.find(name)
        if m is None:
            return self._json(404, {"error": f'model "{name}" not found, try pulling it first'})
        if "completion" not in m.caps:  # Ollama's answer for an embedding-only model
            return self._json(400, {"error": f'"{name}" does not support {"chat" if chat else "generate"}'})
        refusal = self._refusal(body, m, chat=chat)
        if refusal:
            return self._json(400, {"error": refusal})
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
        calls = self._tool_calls(body) if chat else []
        if calls:
            pieces: Any = iter([("", "stop")])
        elif body.get("format"):
            pieces = json_pieces(body["format"], limit)
        else:
            pieces = fakegen.generate(
                prompt, seed=options.get("seed"), max_tokens=limit, stops=options.get("stop") or ()
            )
        top = int(body.get("top_logprobs") or 0)
        want_logprobs = bool(body.get("logprobs")) and _version(self.state.version) >= MIN_LOGPROBS

        def frame(text: str, logprobs: list | None = None, tool_calls: list | None = None) -> dict[str, Any]:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = tool_calls
            out = {**base, "done": False, **({"message": message} if chat else {"response": text})}
            if logprobs:
                out["logprobs"] = logprobs
            return out

        texts, reason, n, logprobs = [], "stop", 0, []
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
                entry = [logprob_entry(text, top)] if want_logprobs else None
                logprobs.extend(entry or ())
                if stream:
                    if self.state.token_delay_s:
                        time.sleep(self.state.token_delay_s)
                    self._line(frame(text, entry))
            if calls and stream:
                self._line(frame("", tool_calls=calls))
            usage = {
                "prompt_eval_count": fakegen.count_tokens(prompt),
                "eval_count": n + 5 * len(calls),
                "total_duration": 1000,
                "load_duration": 10,
                "prompt_eval_duration": 100,
                "eval_duration": 800,
            }
            final = frame("", None) if stream else frame("".join(texts), logprobs, calls)
            final.update(done=True, done_reason=reason, **usage)
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
        if "embedding" not in m.caps:
            return self._json(400, {"error": f'"{name}" does not support embeddings'})
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
        self._json(
            200,
            {
                "model": name,
                "embeddings": [fakegen.embedding(t) for t in inputs],
                "total_duration": 10,
                "load_duration": 1,
                "prompt_eval_count": len(inputs),
            },
        )


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text or VERSION)[:3])


def instance(schema: Any) -> Any:
    """A JSON value valid against the schemas the tests send: enum/const, object (every
    listed property), array (``minItems``, at least one), string (``minLength``, at least
    one character), integer/number (``minimum``), boolean, null."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "object" if "properties" in schema else "string")
    kind = next((k for k in kind if k != "null"), "null") if isinstance(kind, list) else kind
    if kind == "object":
        return {k: instance(v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [instance(schema.get("items") or {}) for _ in range(max(1, int(schema.get("minItems", 0))))]
    if kind == "string":
        return "w" * max(1, int(schema.get("minLength", 0)))
    if kind in ("integer", "number"):
        low = schema.get("minimum", 1)
        return int(low) if kind == "integer" else float(low) + 0.5
    return {"boolean": True, "null": None}.get(kind)


def json_pieces(fmt: Any, limit: int | None) -> Any:
    """``format``'s answer in pieces of four characters, then its end, as fakegen yields them."""
    text = json.dumps(instance(fmt) if isinstance(fmt, dict) else {"answer": "alpha bravo"})
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    if limit is not None and len(pieces) > limit:
        return iter([*((p, None) for p in pieces[:limit]), ("", "length")])
    return iter([*((p, None) for p in pieces), ("", "stop")])


def logprob_entry(token: str, top: int) -> dict[str, Any]:
    """Ollama's entry for one token: a log-probability below zero, ``top`` alternatives with
    the token itself first and each below the one before (none asked: the field is left out)."""
    lp = -0.01 - (zlib.crc32(token.encode()) % 90) / 100
    entry: dict[str, Any] = {"token": token, "logprob": lp, "bytes": list(token.encode())}
    if top:
        others = [w for w in fakegen.WORDS if w != token.strip()]
        alts = [token, *others][:top]
        entry["top_logprobs"] = [{"token": t, "logprob": lp - i, "bytes": list(t.encode())} for i, t in enumerate(alts)]
    return entry


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

    def __enter__(self) -> FakeOllama:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.server_close()
