"""A stand-in for the ``mlc_llm`` CLI, for tests: ``fake_mlc_llm.py serve MODEL [options]``.

It takes ``mlc_llm serve``'s arguments (python/mlc_llm/cli/serve.py), refuses a folder
without ``mlc-chat-config.json`` as MLC does, and serves the OpenAI-compatible routes
``mlc_llm serve`` offers (``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions``) with SSE streams, ``stream_options.include_usage`` and MLC's
error body for a prompt longer than the context. It generates words with
:mod:`tests.runtimes.fakegen`. Real MLC is never run in these tests.

Test knobs (environment): FAKE_MLC_ARGV_FILE (write argv as JSON), FAKE_MLC_STARTUP_S
(sleep before listening), FAKE_MLC_FAIL (print it and exit 1 at start),
FAKE_MLC_CRASH_AFTER (exit abruptly after that many streamed tokens),
FAKE_MLC_TOKEN_DELAY_S, FAKE_MLC_EVENTS_FILE (append "disconnect" lines).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.runtimes import fakegen  # noqa: E402

STREAMED = {"tokens": 0}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser("fake mlc_llm")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("model")
    s.add_argument("--device", default="auto")
    s.add_argument("--model-lib", default=None)
    s.add_argument("--mode", choices=["local", "interactive", "server"], default="local")
    s.add_argument("--overrides", default="")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--allow-origins", type=json.loads, default=["*"])
    return p.parse_args(argv)


def overrides(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(";") if item)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    model_id = ""
    context = 4096

    def log_message(self, fmt: str, *args: Any) -> None:
        sys.stderr.write("fake-mlc: " + fmt % args + "\n")

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"object": "error", "message": message, "code": status})

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(
                200, {"object": "list", "data": [{"id": self.model_id, "object": "model", "owned_by": "MLC-LLM"}]}
            )
        else:
            self._error(404, "not found")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/v1/chat/completions":
            prompt = "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in body.get("messages", []))
            self._complete(body, prompt, chat=True)
        elif self.path == "/v1/completions":
            self._complete(body, body.get("prompt", ""), chat=False)
        else:
            self._error(404, "not found")

    def _complete(self, body: dict[str, Any], prompt: str, *, chat: bool) -> None:
        if body.get("model") not in (None, self.model_id):
            return self._error(404, f'The requested model "{body.get("model")}" is not served.')
        n_prompt = fakegen.count_tokens(prompt)
        if n_prompt > self.context:
            return self._error(
                400,
                f"Request prompt has {n_prompt} tokens in total, "
                f"larger than the model input length limit {self.context}.",
            )
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        limit = body.get("max_tokens")
        limit = min(limit if limit is not None else 100_000, self.context - n_prompt)
        pieces = fakegen.generate(prompt, seed=body.get("seed"), max_tokens=limit, stops=stops)
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(text: str | None, finish: str | None, usage: dict | None = None) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text or ""
            return {
                "id": "cmpl-1",
                "object": kind,
                "created": int(time.time()),
                "model": self.model_id,
                "system_fingerprint": "",
                "choices": [choice] if text is not None or finish else [],
                "usage": usage,
            }

        if not body.get("stream"):
            texts, finish = [], "stop"
            for text, end in pieces:
                if end:
                    finish = end
                else:
                    texts.append(text)
            usage = {"prompt_tokens": n_prompt, "completion_tokens": len(texts), "total_tokens": n_prompt + len(texts)}
            choice = {"index": 0, "finish_reason": finish}
            choice.update(
                {"message": {"role": "assistant", "content": "".join(texts)}} if chat else {"text": "".join(texts)}
            )
            return self._json(
                200,
                {
                    "id": "cmpl-1",
                    "object": kind[:-6] if chat else kind,
                    "choices": [choice],
                    "model": self.model_id,
                    "usage": usage,
                },
            )
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        delay = float(os.environ.get("FAKE_MLC_TOKEN_DELAY_S") or 0)
        crash_after = int(os.environ.get("FAKE_MLC_CRASH_AFTER") or 0)
        n = 0
        try:
            for text, finish in pieces:
                if finish:
                    self._send(event("", finish))
                    if (body.get("stream_options") or {}).get("include_usage"):
                        usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
                        self._send(event(None, None, usage))
                    break
                n += 1
                STREAMED["tokens"] += 1
                if crash_after and STREAMED["tokens"] > crash_after:
                    sys.stderr.write("fake-mlc: simulated crash in the engine\n")
                    sys.stderr.flush()
                    os._exit(7)
                if delay:
                    time.sleep(delay)
                self._send(event(text, None))
            self._raw(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            events = os.environ.get("FAKE_MLC_EVENTS_FILE")
            if events:
                with open(events, "a") as f:
                    f.write("disconnect\n")
            self.close_connection = True

    def _send(self, data: dict[str, Any]) -> None:
        self._raw(b"data: " + json.dumps(data).encode() + b"\n\n")

    def _raw(self, raw: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
        self.wfile.flush()


def main(argv: list[str]) -> int:
    if os.environ.get("FAKE_MLC_ARGV_FILE"):
        Path(os.environ["FAKE_MLC_ARGV_FILE"]).write_text(json.dumps(argv))
    args = parse(argv)
    if os.environ.get("FAKE_MLC_FAIL"):
        print(os.environ["FAKE_MLC_FAIL"], file=sys.stderr, flush=True)
        return 1
    config_path = Path(args.model) / "mlc-chat-config.json"
    if not config_path.is_file():
        print(f"ValueError: {args.model} is not a valid MLC model directory", file=sys.stderr, flush=True)
        return 1
    config = json.loads(config_path.read_text())
    Handler.model_id = args.model
    Handler.context = int(
        overrides(args.overrides).get("context_window_size") or config.get("context_window_size", 4096)
    )
    time.sleep(float(os.environ.get("FAKE_MLC_STARTUP_S") or 0))
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"fake-mlc: serving {args.model} on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
