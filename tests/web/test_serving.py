"""How the web app is served: its files from the package with their types, a strict CSP and ETags;
without the key for the files only; nothing outside static/; off with server.web = false."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from localrun.server.app import create_app
from localrun.server.web.assets import CONTENT_SECURITY_POLICY, load_assets

KEY = "web-key-1"


@pytest.fixture
def keyed(build_stack):
    stack = build_stack(api_key=KEY)
    with TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost") as c:
        yield c


def test_the_page_and_its_files_load_without_the_key_with_a_strict_csp(keyed):
    page = keyed.get("/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    assert csp == CONTENT_SECURITY_POLICY and "default-src 'self'" in csp and "script-src 'self';" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["cache-control"] == "no-cache"
    # No inline script or style, nothing from another origin: the page names only its own files.
    html = page.text
    assert "<style" not in html and " style=" not in html and not re.search(r"<script(?![^>]*\bsrc=)", html)
    assert not re.search(r"(src|href)=\"(https?:)?//", html)
    for name, ctype in (("app.js", "text/javascript"), ("app.css", "text/css"), ("icon.svg", "image/svg+xml")):
        r = keyed.get(f"/web/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(ctype), name
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        again = keyed.get(f"/web/{name}", headers={"if-none-match": r.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
    head = keyed.head("/web/app.js")
    assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) > 1000


def test_the_api_still_needs_the_key_and_only_files_are_served(keyed):
    assert keyed.get("/admin/models").status_code == 401
    assert keyed.get("/v1/models").status_code == 401
    assert keyed.post("/", json={}).status_code in (401, 405)  # only GET and HEAD of the files are open
    for path in ("/web/", "/web/nope.js", "/web/index.html", "/web/..%2Fassets.py", "/web/%2e%2e/routes.py"):
        r = keyed.get(path)
        assert r.status_code in (401, 404), path  # never a file from outside static/
        assert "CONTENT_SECURITY_POLICY" not in r.text
    good = {"authorization": f"Bearer {KEY}"}
    data = keyed.get("/admin/models", headers=good).json()
    [tiny] = data["models"]
    assert tiny["name"] == "tiny" and tiny["fit"] in ("fits", "tight", "wont-fit") and tiny["size"] > 0
    assert tiny["format"] == "gguf" and tiny["loaded"] is False and tiny["planned_slots"] >= 1
    assert data["mirror"]["enabled"] is False and data["hub"]["endpoint"].startswith("http")


def test_the_web_app_can_be_turned_off(build_stack):
    stack = build_stack(web=False)
    with TestClient(create_app(stack.settings, stack.manager), base_url="http://localhost") as c:
        assert c.get("/").text == "localrun is running"
        assert c.get("/web/app.js").status_code == 404
        assert c.get("/admin/models").status_code == 404


def test_every_file_is_small_and_the_whole_app_under_300_kb():
    assets = load_assets()
    assert {"index.html", "app.js", "app.css", "api.js", "chat.js", "markdown.js", "machine.js"} <= set(assets)
    total = sum(len(a.body) for a in assets.values())
    assert total < 300_000, total


@pytest.mark.parametrize("web", [True, False])
def test_the_tuis_embedded_server_serves_the_page_unless_turned_off(build_stack, web):
    from localrun.tui.embedded import EmbeddedServer

    stack = build_stack(web=web)
    app = EmbeddedServer(stack.settings, stack.manager, host="127.0.0.1", port=1).build_app()
    with TestClient(app, base_url="http://localhost") as c:
        page = c.get("/")
        assert page.headers["content-type"].startswith("text/html" if web else "text/plain")
        assert (c.get("/web/app.js").status_code == 200) is web
