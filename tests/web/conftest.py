"""Browser fixtures: Debian's chromium driven by playwright, one browser per module.

playwright is told where chromium is (``executable_path``) and never downloads a browser of its own;
where chromium or playwright is missing (``scripts/dev setup test`` installs both when it can), the
tests skip with a message saying how to get them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        pytest.skip("Debian's chromium is not installed: `apt-get install chromium` (scripts/dev setup test does it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is missing: pip install -e '.[test]'")
    with sync_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, args=["--disable-gpu", "--disable-dev-shm-usage"])
        yield launched
        launched.close()


@dataclass
class Watched:
    """A page and everything it did: each request's URL, console errors and uncaught exceptions."""

    page: object
    origin: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    answer: str = ""  # what a prompt() dialog is answered with (confirm() dialogs are accepted)

    def foreign_requests(self) -> list[str]:
        """Requests that left the page's origin (data: and blob: URLs never leave the page)."""
        return [u for u in self.requests if not u.startswith(("data:", "blob:")) and origin_of(u) != self.origin]


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def open_page(browser, url: str, *, width: int = 1100, height: int = 800, color_scheme: str = "light") -> Watched:
    """A fresh context (its own storage) on ``url``, with every request and console error recorded."""
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=color_scheme)
    context.set_default_timeout(15_000)  # a hung page fails in seconds, not at the suite's timeout
    page = context.new_page()
    watched = Watched(page, origin_of(url))
    page.on("request", lambda r: watched.requests.append(r.url))
    page.on("console", lambda m: watched.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: watched.errors.append(f"uncaught: {e}"))
    page.on("dialog", lambda d: d.accept(watched.answer) if d.type == "prompt" else d.accept())
    page.goto(url)
    return watched
