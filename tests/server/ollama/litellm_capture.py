"""Capture the requests litellm's Ollama providers send, for test_ollama_litellm.py (not a test).

Run once, by hand, in a throwaway virtualenv with litellm installed (``pip install
litellm==1.110.2``): ``python tests/server/ollama/litellm_capture.py > litellm_requests.json``.
A stub on 127.0.0.1 records each request and answers as Ollama would, just enough for litellm
to finish; nothing leaves the machine (litellm's cost-map fetch fails and falls back).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SEEN: list[dict] = []
DONE = {"done": True, "done_reason": "stop", "prompt_eval_count": 3, "eval_count": 2, "total_duration": 1}
MESSAGES = [{"role": "user", "content": "hello"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def _answer(path: str, body: dict) -> list[dict]:
    """The lines of a streamed answer (the last one alone when not streamed)."""
    model = body.get("model", "tiny")
    if path == "/api/chat":
        part = {"model": model, "message": {"role": "assistant", "content": "hi"}, "done": False}
        return [part, {**DONE, "model": model, "message": {"role": "assistant", "content": "hi"}}]
    if path == "/api/generate":
        return [{"model": model, "response": "hi", "done": False}, {**DONE, "model": model, "response": "hi"}]
    if path == "/api/embed":
        n = len(body["input"]) if isinstance(body.get("input"), list) else 1
        return [{"model": model, "embeddings": [[0.6, 0.8]] * n, "prompt_eval_count": 2}]
    if path == "/api/show":
        return [
            {"template": "", "details": {"family": "llama"}, "model_info": {}, "capabilities": ["completion", "tools"]}
        ]
    return [{}]


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.loads(raw) if raw else {}
        SEEN.append(
            {"method": "POST", "path": self.path, "content_type": self.headers.get("content-type"), "body": body}
        )
        lines = _answer(self.path, body)
        streamed = body.get("stream") is not False and self.path in ("/api/chat", "/api/generate")
        out = b"".join(json.dumps(x).encode() + b"\n" for x in lines) if streamed else json.dumps(lines[-1]).encode()
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson" if streamed else "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args) -> None:
        """Quiet: stdout is the capture."""


def main() -> None:
    import litellm

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    calls = {
        "ollama/ completion": lambda: litellm.completion(
            model="ollama/tiny", messages=MESSAGES, api_base=base, max_tokens=8, temperature=0
        ),
        "ollama/ completion stream": lambda: list(
            litellm.completion(model="ollama/tiny", messages=MESSAGES, api_base=base, max_tokens=8, stream=True)
        ),
        "ollama_chat/ completion": lambda: litellm.completion(
            model="ollama_chat/tiny",
            messages=MESSAGES,
            api_base=base,
            max_tokens=8,
            temperature=0,
            top_p=0.9,
            seed=1,
            stop=["zzz"],
        ),  # fmt: skip
        "ollama_chat/ completion stream": lambda: list(
            litellm.completion(model="ollama_chat/tiny", messages=MESSAGES, api_base=base, max_tokens=8, stream=True)
        ),
        "ollama_chat/ tools": lambda: litellm.completion(
            model="ollama_chat/tiny",
            messages=[{"role": "user", "content": "call lookup"}],
            tools=TOOLS,
            api_base=base,
            max_tokens=8,
        ),  # fmt: skip
        "ollama_chat/ aider-style num_ctx": lambda: list(
            litellm.completion(
                model="ollama_chat/tiny", messages=MESSAGES, api_base=base, num_ctx=1024, max_tokens=8, stream=True
            )
        ),
        "ollama_chat/ json": lambda: litellm.completion(
            model="ollama_chat/tiny",
            messages=MESSAGES,
            api_base=base,
            response_format={"type": "json_object"},
            max_tokens=8,
        ),  # fmt: skip
        "ollama/ embedding": lambda: litellm.embedding(model="ollama/tiny", input=["a", "b"], api_base=base),
    }
    cases = []
    for name, call in calls.items():
        start = len(SEEN)
        call()
        cases.append({"case": name, "requests": SEEN[start:]})
    from importlib.metadata import version

    print(json.dumps({"litellm": version("litellm"), "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
