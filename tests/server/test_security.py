"""Security defaults: Host allowlist, JSON-only bodies, API key, body limit, CORS, binding."""

from __future__ import annotations

import asyncio
import re

import httpx
import openai
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from localrun.server.app import create_app
from localrun.server.security import allowed_host_names, host_allowed

BAD_HOSTS = [
    "evil.localhost",
    "a.local",
    "x.internal",
    "127.0.0.1.nip.io",
    "",
    "localhost.",
    "localhost:abc",
    "localhost:99999",
    "localhost:",
    "127.0.0.2",
    "0.0.0.0",
    "::1",
    "[::2]",
    "evil.com",
    "localhost.evil.com",
    "127.0.0.1@evil.com",
    "evil.com#127.0.0.1",
    "127.1",
    "2130706433",
    "0x7f000001",
    "[::ffff:127.0.0.1]",
    "localhost:8739:1",
    "127.0.0.1:80.evil.com",
    "[::1]evil",
    "lo%63alhost",
    "xn--localhost",
    "localhost,evil.com",
]
GOOD_HOSTS = ["localhost", "localhost:8739", "127.0.0.1", "127.0.0.1:1", "[::1]", "[::1]:8739", "LocalHost:80"]


def routes(app) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, path parameters filled in."""
    found = []
    pending = list(app.routes)
    while pending:
        route = pending.pop(0)
        inner = getattr(route, "original_router", None)  # FastAPI's included-router wrapper
        if inner is not None:
            pending.extend(inner.routes)
            continue
        if not isinstance(route, APIRoute):
            continue
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        for method in sorted(route.methods - {"HEAD"}):
            found.append((method, path))
    return found


def send(client: TestClient, method: str, path: str, **kw):
    if method in ("POST", "DELETE"):
        kw.setdefault("json", {})
    return client.request(method, path, **kw)


def test_every_route_is_in_the_matrix(client):
    table = routes(client.app)
    assert len(table) >= 20
    assert (
        ("POST", "/v1/chat/completions") in table
        and ("POST", "/api/chat") in table
        and ("GET", "/admin/events") in table
    )


@pytest.mark.parametrize("host", BAD_HOSTS)
def test_bad_host_is_refused_on_every_route(client, stack, host):
    for method, path in routes(client.app):
        r = send(client, method, path, headers={"host": host})
        assert r.status_code == 403, (host, method, path, r.status_code)
        body = r.json()
        assert "not allowed" in (body["error"] if path.startswith("/api/") else body["error"]["message"])
    assert stack.manager.loaded() == []  # nothing was loaded or generated


@pytest.mark.parametrize("host", GOOD_HOSTS)
def test_allowed_host_passes_on_every_route(client, host):
    for method, path in routes(client.app):
        if path == "/admin/events":  # an endless stream; checked on a live server below
            continue
        r = send(client, method, path, headers={"host": host})
        assert r.status_code != 403, (host, method, path, r.text)


def test_missing_host_header_is_refused(stack):
    app = create_app(stack.settings, stack.manager)
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def capture(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.0",
        "method": "GET",
        "scheme": "http",
        "path": "/health",
        "raw_path": b"/health",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8739),
    }
    asyncio.run(app(scope, receive, capture))
    assert sent[0]["status"] == 403
    scope["headers"] = [(b"host", b"localhost"), (b"host", b"evil.com")]  # two Host headers: ambiguous
    sent.clear()
    asyncio.run(app(scope, receive, capture))
    assert sent[0]["status"] == 403


def test_configured_names_and_bind_ip_are_allowed(build_stack):
    stack = build_stack(allowed_hosts=["mybox.lan"], host="192.168.7.7", api_key="k-test-key")
    with TestClient(create_app(stack.settings, stack.manager), base_url="http://mybox.lan") as c:
        assert c.get("/health", headers={"authorization": "Bearer k-test-key"}).status_code == 200
        assert (
            c.get("/health", headers={"authorization": "Bearer k-test-key", "host": "192.168.7.7:8739"}).status_code
            == 200
        )
        assert (
            c.get("/health", headers={"authorization": "Bearer k-test-key", "host": "evil.mybox.lan"}).status_code
            == 403
        )
    names = allowed_host_names("0.0.0.0", [])
    assert "0.0.0.0" not in names and host_allowed("[::1]:1", names) and not host_allowed("0.0.0.0:1", names)


def test_text_plain_post_starts_nothing(client, stack):
    body = '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}'
    for path in ("/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate", "/admin/load", "/api/pull"):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
            headers = {"origin": "https://evil.example", **({"content-type": ctype} if ctype else {})}  # a browser's
            r = client.post(path, content=body, headers=headers)
            assert r.status_code == 415, (path, ctype, r.status_code)
    assert stack.manager.loaded() == []
    ok = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_body_size_limit(build_stack):
    stack = build_stack(max_body_bytes=2048)
    with TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost") as c:
        big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 5000}]}
        r = c.post("/v1/chat/completions", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

        def chunks():  # no Content-Length: the limit holds while reading
            yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}]}'

        r = c.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert stack.manager.loaded() == []


def test_api_key_required_everywhere_when_set(build_stack):
    stack = build_stack(api_key="s3cret-key")
    app = create_app(stack.settings, stack.manager)
    with TestClient(app, base_url="http://localhost") as c:
        for method, path in routes(app):
            for headers in (
                {},
                {"authorization": "Bearer wrong"},
                {"authorization": "s3cret-key"},
                {"authorization": "Basic s3cret-key"},
            ):
                r = send(c, method, path, headers=headers)
                if (method, path) == ("GET", "/health"):  # probes carry no key: liveness, nothing more
                    assert r.status_code == 200 and r.json() == {"status": "ok"}, headers
                    continue
                if (method, path) in (("GET", "/"), ("GET", "/web/x")):  # the web page's own files: nothing secret
                    assert r.status_code in (200, 404) and "s3cret-key" not in r.text, (path, r.status_code)
                    continue
                assert r.status_code == 401, (method, path, headers)
                err = r.json()["error"]
                if path.startswith("/v1/messages"):  # Anthropic's shape: no code
                    assert err["type"] == "authentication_error" and r.json()["type"] == "error"
                elif not path.startswith("/api/"):
                    assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
                assert "s3cret-key" not in r.text
        good = {"authorization": "Bearer s3cret-key"}
        assert c.get("/v1/models", headers=good).status_code == 200
        assert c.post("/admin/load", json={"model": "tiny"}, headers=good).status_code == 200


def test_api_key_with_official_client(build_stack, live_factory):
    live = live_factory(build_stack(api_key="k-123-test-key"))
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as info:
            bad.models.list()
        assert info.value.body["type"] == "authentication_error"
    with openai.OpenAI(base_url=f"{live.url}/v1", api_key="k-123-test-key", max_retries=0) as good:
        assert [m.id for m in good.models.list().data] == ["tiny"]


def test_no_cors_unless_configured(client, build_stack):
    r = client.options(
        "/v1/models", headers={"origin": "https://evil.example", "access-control-request-method": "POST"}
    )
    assert "access-control-allow-origin" not in r.headers
    r = client.get("/v1/models", headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    stack = build_stack(cors_origins=["https://app.example"])
    with TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost") as c:
        pre = c.options(
            "/v1/chat/completions",
            headers={
                "origin": "https://app.example",
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type",
            },
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
        other = c.options(
            "/v1/chat/completions", headers={"origin": "https://evil.example", "access-control-request-method": "POST"}
        )
        assert other.headers.get("access-control-allow-origin") != "https://evil.example"
        # A text/plain POST (no preflight) is read as JSON from an origin CORS trusts, as Ollama
        # does, and refused from any other
        for origin, status in (("https://app.example", 400), ("https://evil.example", 415)):
            r = c.post(
                "/v1/chat/completions",
                content="{}",
                headers={"origin": origin, "content-type": "text/plain"},
            )
            assert r.status_code == status, (origin, r.text)


def test_admin_events_stream_on_a_live_server(live):
    with httpx.stream("GET", f"{live.url}/admin/events", timeout=5) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(lines) == "event: status"
        assert next(lines).startswith("data: {")
    with httpx.stream("GET", f"{live.url}/admin/events", headers={"host": "evil.localhost"}, timeout=5) as r:
        assert r.status_code == 403
