"""The transport guards as real clients meet them, against a real server process (fake runtime):
Ollama's documented curl examples (no Content-Type: application/json), ignored-field names that
once made an illegal header, HEAD /health, CORS preflights from local origins, and the DEBUG
access line. The metrics flood and the slow clients have files of their own."""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
from urllib.parse import unquote

import httpx
import pytest
from fastapi.testclient import TestClient

from localrun.server.app import create_app
from tests.support import servers
from tests.support.capabilities import ALL

#: Ollama's docs/api.md examples, verbatim but for the port (github.com/ollama/ollama, docs/api.md).
OLLAMA_CURL_EXAMPLES = {
    "generate": """curl http://localhost:11434/api/generate -d '{
  "model": "llama3.2",
  "prompt": "Why is the sky blue?"
}'""",
    "generate-no-stream": """curl http://localhost:11434/api/generate -d '{
  "model": "llama3.2",
  "prompt": "Why is the sky blue?",
  "stream": false
}'""",
    "generate-json": """curl http://localhost:11434/api/generate -d '{
  "model": "llama3.2",
  "prompt": "What color is the sky at different times of the day? Respond using JSON",
  "format": "json",
  "stream": false
}'""",
    "generate-seed": """curl http://localhost:11434/api/generate -d '{
  "model": "mistral",
  "prompt": "Why is the sky blue?",
  "options": {
    "seed": 123
  }
}'""",
    "generate-load": """curl http://localhost:11434/api/generate -d '{
  "model": "llama3.2"
}'""",
    "chat": """curl http://localhost:11434/api/chat -d '{
  "model": "llama3.2",
  "messages": [
    {
      "role": "user",
      "content": "why is the sky blue?"
    }
  ]
}'""",
    "tags": "curl http://localhost:11434/api/tags",
    "show": """curl http://localhost:11434/api/show -d '{
  "model": "llava"
}'""",
    "embed": """curl http://localhost:11434/api/embed -d '{
  "model": "all-minilm",
  "input": "Why is the sky blue?"
}'""",
    "embed-many": """curl http://localhost:11434/api/embed -d '{
  "model": "all-minilm",
  "input": ["Why is the sky blue?", "Why is the grass green?"]
}'""",
    "embeddings": """curl http://localhost:11434/api/embeddings -d '{
  "model": "all-minilm",
  "prompt": "Here is an article about llamas..."
}'""",
    "ps": "curl http://localhost:11434/api/ps",
    "version": "curl http://localhost:11434/api/version",
}
#: The names the examples use, each the tiny model.
EXAMPLE_MODELS = ("llama3.2", "llava", "all-minilm", "mistral")


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_gguf):
    """One launcher process at DEBUG on the fake runtime (every capability), the tiny model under
    each name the Ollama examples use."""
    home = tmp_path_factory.mktemp("guards-home")
    for name in EXAMPLE_MODELS:
        servers.import_model(home, tiny_gguf, name)
    spec = servers.launcher(servers.free_port(), home=home, options={"fake_capabilities": list(ALL)}, log_level="DEBUG")
    proc = servers.start(spec, home / "server.log")
    yield proc
    proc.stop()


def _run_curl(command: str, port: int) -> tuple[int, str]:
    """``command`` as documented, with only the port changed; curl's own flags added after it say
    where its output goes and never change the request."""
    args = [a.replace("localhost:11434", f"localhost:{port}") for a in shlex.split(command)]
    out = subprocess.run(
        [*args, "-sS", "--max-time", "60", "-w", "\n%{http_code}"], capture_output=True, text=True, timeout=90
    )
    assert out.returncode == 0, (command, out.returncode, out.stderr)  # 52 was the dropped connection
    body, _, code = out.stdout.rpartition("\n")
    return int(code), body


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs the curl binary")
@pytest.mark.parametrize("example", sorted(OLLAMA_CURL_EXAMPLES))
def test_ollama_documented_curl_examples_work_verbatim(server, example):
    """curl -d sends application/x-www-form-urlencoded: a client that is not a browser is read as JSON."""
    status, body = _run_curl(OLLAMA_CURL_EXAMPLES[example], server.spec.port)
    assert status == 200, (example, body[:500])
    lines = [json.loads(line) for line in body.splitlines() if line.strip()]  # one object, or NDJSON
    assert lines and all(isinstance(line, dict) for line in lines), body[:500]
    if example.startswith("embed"):
        assert lines[0].get("embeddings") or lines[0].get("embedding")
    if example in ("generate", "generate-seed"):
        assert lines[-1]["done"] is True and len(lines) > 1  # streamed


def test_a_browser_shaped_request_still_needs_json(server):
    """Origin or any Sec-Fetch-* header marks a browser: text/plain stays a 415 there (CSRF)."""
    body = '{"model": "llama3.2", "prompt": "hi", "stream": false}'
    url = f"{server.url}/api/generate"
    for browser in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Mode": "cors"}):
        r = httpx.post(url, content=body, headers={"Content-Type": "text/plain", **browser}, timeout=30)
        assert r.status_code == 415, (browser, r.text)
    plain = httpx.post(url, content=body, headers={"Content-Type": "text/plain"}, timeout=30)
    assert plain.status_code == 200, plain.text
    bad_host = httpx.post(url, content=body, headers={"Host": "evil.example"}, timeout=30)
    assert bad_host.status_code == 403  # the Host allowlist still stands against rebinding


def _raw_post(port: int, path: str, body: bytes) -> tuple[int, dict[str, list[str]]]:
    """POST over a raw socket and parse the response head ourselves: a client library would hide
    an illegal header line, and a dropped connection shows as an empty read."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        sock.sendall(head + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data, "the server closed the connection without answering"
    head_bytes, _, _ = data.partition(b"\r\n\r\n")
    status_line, *lines = head_bytes.decode("ascii").split("\r\n")  # a non-ASCII header fails here
    headers: dict[str, list[str]] = {}
    for line in lines:
        name, _, value = line.partition(":")
        assert value == value.strip(" \t") or value.startswith(" "), line
        value = value.strip(" \t")
        assert all(" " <= c <= "~" for c in value), line
        headers.setdefault(name.lower(), []).append(value)
    return int(status_line.split()[1]), headers


HOSTILE_NAMES = [" x", "x ", "", "\t", "a,b", "\x01ctl", "\x7f", "é", "名前", "\ud800", "%41", "x" * 300, '"q"', "a b"]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=[repr(n)[:20] for n in HOSTILE_NAMES])
def test_ignored_field_names_never_break_the_response(server, name):
    """Once a name with a space at either end (or an empty one beside another) made an illegal
    X-Localrun-Ignored-Fields header and the server dropped the connection (curl exit 52)."""
    doc = '{"model": "llama3.2", "prompt": "hi", "stream": false, ' + json.dumps(name) + ': 1, "other_field": 2}'
    status, headers = _raw_post(server.spec.port, "/api/generate", doc.encode())
    if name == "\ud800":  # a lone surrogate anywhere in a body is refused, by name (server/validate.py)
        assert status == 400
        return
    assert status == 200
    listed = [unquote(n) for n in headers["x-localrun-ignored-fields"][0].split(", ")]
    assert "other_field" in listed
    shown = name if len(name) <= 64 else name[:64] + "..."
    unlisted = int(headers.get("x-localrun-ignored-fields-unlisted", ["0"])[0])
    if name == "":  # nothing to show: left out and counted
        assert unlisted == 1 and len(listed) == 1
    else:
        assert shown in listed and unlisted == 0


def test_many_ignored_names_are_listed_up_to_the_cap_and_counted(server):
    from localrun.server.fields import MAX_LISTED

    extra = {f"f{i}": i for i in range(MAX_LISTED + 5)}
    doc = json.dumps({"model": "llama3.2", "prompt": "hi", "stream": False, "": 0, **extra})
    status, headers = _raw_post(server.spec.port, "/api/generate", doc.encode())
    assert status == 200
    assert len(headers["x-localrun-ignored-fields"][0].split(", ")) == MAX_LISTED
    assert headers["x-localrun-ignored-fields-unlisted"] == ["6"]


def test_head_health_is_200(server):
    r = httpx.head(f"{server.url}/health", timeout=10)
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-type"].startswith("application/json")


LOCAL_ORIGINS = [
    "http://localhost",
    "http://localhost:3000",
    "https://localhost:8443",
    "http://127.0.0.1:5173",
    "http://[::1]:8080",
    "app://obsidian.md",
    "tauri://localhost",
    "vscode-webview://1234abcd",
    "vscode-file://vscode-app",
    "file://",
    "chrome-extension://abcdefghijklmnop",
]
FOREIGN_ORIGINS = [
    "https://evil.example",
    "null",
    "http://localhost.evil.example",
    "http://127.0.0.1.evil.example",
    "http://0.0.0.0:8080",
    "http://localhost:3000.evil.example",
    "https://app.example",
]


def _preflight(url: str, origin: str, method: str = "POST") -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "content-type,authorization,x-stainless-os",
    }
    return httpx.options(url, headers=headers, timeout=10)


def test_cors_preflight_from_local_origins_succeeds_by_default(server):
    """Ollama allows localhost pages and app shells by default; a page elsewhere stays refused."""
    for origin in LOCAL_ORIGINS:
        r = _preflight(f"{server.url}/api/chat", origin)
        assert r.status_code == 200, (origin, r.status_code, r.text)
        assert r.headers["access-control-allow-origin"] == origin
        assert "POST" in r.headers["access-control-allow-methods"]
        tags = httpx.get(f"{server.url}/api/tags", headers={"Origin": origin}, timeout=10)
        assert tags.headers["access-control-allow-origin"] == origin
    for origin in FOREIGN_ORIGINS:
        r = _preflight(f"{server.url}/api/chat", origin)
        assert "access-control-allow-origin" not in r.headers, origin
        tags = httpx.get(f"{server.url}/api/tags", headers={"Origin": origin}, timeout=10)
        assert "access-control-allow-origin" not in tags.headers, origin


def test_cors_settings_add_origins_and_can_drop_the_local_ones(build_stack):
    stack = build_stack(cors_origins=["https://app.example"], cors_local_origins=False)
    with TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost") as c:
        headers = {"access-control-request-method": "POST"}
        ok = c.options("/api/chat", headers={"origin": "https://app.example", **headers})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        local = c.options("/api/chat", headers={"origin": "http://localhost:3000", **headers})
        assert "access-control-allow-origin" not in local.headers


def test_cors_keeps_the_api_key_rule(build_stack):
    """A preflight carries no key and is answered; the request itself still needs it."""
    stack = build_stack(api_key="k-cors-test")
    with TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost") as c:
        origin = {"origin": "http://localhost:3000"}
        pre = c.options("/v1/models", headers={**origin, "access-control-request-method": "GET"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == origin["origin"]
        refused = c.get("/v1/models", headers=origin)
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == origin["origin"]
        assert c.get("/v1/models", headers={**origin, "authorization": "Bearer k-cors-test"}).status_code == 200
        assert c.head("/health").status_code == 200  # liveness without the key, HEAD too


def _access_lines(server) -> list[str]:
    return [line for line in server.log_text().splitlines() if "localrun.server.access" in line]


def test_debug_log_has_one_line_per_request_with_its_detail(server):
    """method, path, route, model, status, time to first byte and total; never the key or the body."""
    secret, text = "sk-never-logged-4711", "a body text that is never logged"
    before = len(_access_lines(server))
    auth = {"Authorization": f"Bearer {secret}"}
    chat = {"model": "llama3.2", "messages": [{"role": "user", "content": text}], "stream": False}
    assert httpx.post(f"{server.url}/api/chat", json=chat, headers=auth, timeout=30).status_code == 200
    missing = {"model": "no-such-model", "prompt": text, "stream": False}
    assert httpx.post(f"{server.url}/api/generate", json=missing, headers=auth, timeout=30).status_code == 404
    assert servers.wait_until(lambda: len(_access_lines(server)) >= before + 2, 10)
    lines = _access_lines(server)[before:]
    assert len(lines) == 2, lines  # one line per request
    ok, refused = lines
    assert ok.startswith("DEBUG ") and '"POST /api/chat" 200' in ok and "route=/api/chat" in ok
    assert "model=llama3.2" in ok and "ttfb=" in ok and "total=" in ok and "ttfb=-" not in ok
    assert '"POST /api/generate" 404' in refused and "model=no-such-model" in refused
    log = server.log_text()
    assert secret not in log and text not in log
