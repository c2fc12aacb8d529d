"""The web app on the real ``localrun serve`` CLI: behind an API key on the intranet address (the page
asks for it, nothing works without it; a colleague pulls a model and chats with it about a picture);
with a real GGUF (SmolLM2 135M Instruct on llama.cpp), whose refusal of an image the page shows in
the server's words.

``LOCALRUN_DOCS_SCREENSHOT=1`` makes the SmolLM2 test write docs/web-app.png, the README's screenshot
(off by default: the picture's numbers change each run, and the tree should stay clean).
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket

import httpx
import pytest

from tests.conftest import needs_llama
from tests.factories import write_tiny_llama_gguf
from tests.hub.fakehub import FakeHub
from tests.hub.repos import make_gguf
from tests.support.launch import REPO
from tests.support.projectors import make_projector
from tests.support.servers import free_port, import_model, localrun_serve, start
from tests.web.conftest import open_page

pytestmark = pytest.mark.slow

KEY = "colleague-key-7"
VISION_REPO = "visionorg/Seeing-GGUF"


def _serve(home, *args, runtime: str | None = None, **env):
    spec = localrun_serve(free_port(), *args, home=home)
    if runtime is not None:
        spec.env["LOCALRUN_RUNTIME__FORCE"] = runtime
    spec.env.update(env)
    spec.timeout = 120.0
    return start(spec, home / "server.log")


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 6), "blue").save(out, format="PNG")
    return out.getvalue()


def _lan_address() -> str | None:
    """This machine's first non-loopback IPv4 address: where a colleague's browser would reach it."""
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_a_colleague_types_the_key_pulls_a_model_and_chats_with_it_with_an_image(browser, tmp_path):
    """The issue's "done": on the intranet address, behind a key, a colleague pulls a model (with its
    projector) from the hub and chats with it about a picture; without the key nothing works."""
    import_model(tmp_path, write_tiny_llama_gguf(tmp_path / "tiny.gguf"), "tiny")
    lan = _lan_address()  # a colleague's view: the page's origin is not a local one (loopback where none)
    allowed = json.dumps([lan] if lan else [])
    hub = FakeHub().start()
    # A model that sees: its GGUF and the projector a pull takes with it (real clip headers).
    hub.add_repo(
        VISION_REPO,
        {"Seeing-Q4_K_M.gguf": make_gguf(quant="Q4_K_M", seed=301), "mmproj-Seeing-F16.gguf": make_projector(seed=1)},
        tags=("gguf",),
    )
    server = _serve(
        tmp_path,
        *("--api-key", KEY, "--host", "0.0.0.0"),
        runtime="fake",
        LOCALRUN_SERVER__ALLOWED_HOSTS=allowed,
        HF_ENDPOINT=hub.url,
    )
    try:
        w = open_page(browser, f"http://{lan or '127.0.0.1'}:{server.spec.port}/")
        page = w.page
        page.wait_for_selector("#keygate", state="visible")
        assert page.locator("#app").is_hidden()
        # The page's files came without the key; the API refuses the page without it.
        status = page.evaluate(
            "async () => [(await fetch('/v1/models')).status,"
            " (await fetch('/admin/load', {method: 'POST', headers: {'Content-Type': 'application/json'},"
            " body: JSON.stringify({model: 'tiny'})})).status]"
        )
        assert status == [401, 401]
        page.fill("#keyinput", "not-the-key")
        page.press("#keyinput", "Enter")
        page.wait_for_selector("#keyerror >> text=not valid")
        assert page.evaluate("() => sessionStorage.length") == 0
        page.fill("#keyinput", KEY)
        page.press("#keyinput", "Enter")
        page.wait_for_selector("body[data-ready=true]")
        assert page.locator("#model option").first.inner_text().startswith("tiny")
        page.fill("#prompt", "hi from a colleague")
        page.press("#prompt", "Enter")
        page.wait_for_selector(".msg.assistant >> text=You said: hi from a colleague")

        # Pull a model that sees (the hub repo has a projector), then ask it about a picture.
        page.click("#tab-machine")
        page.fill("#pullref", VISION_REPO + ":Q4_K_M")
        page.press("#pullref", "Enter")
        page.wait_for_selector("#pulls >> text=: done", timeout=30_000)
        page.click("#tab-chat")
        page.click("#new-chat")
        [pulled] = [v for v in page.locator("#model option").evaluate_all("os => os.map(o => o.value)") if v != "tiny"]
        page.select_option("#model", pulled)
        assert "vision" in page.inner_text("#model-caps")
        image = tmp_path / "blue.png"
        image.write_bytes(_png())
        page.set_input_files("#file", str(image))
        page.fill("#prompt", "what is in this picture?")
        page.press("#prompt", "Enter")
        page.wait_for_selector(".msg.assistant >> text=image/png")

        assert page.evaluate("() => sessionStorage.getItem('localrun.apiKey')") == KEY

        # A key the server no longer takes (changed, or a restart with another): the page asks again.
        page.evaluate("() => sessionStorage.setItem('localrun.apiKey', 'stale')")
        page.click("#tab-machine")
        page.wait_for_selector("#keyerror >> text=refused")
        page.fill("#keyinput", KEY)
        page.press("#keyinput", "Enter")
        page.wait_for_selector("#models >> text=tiny")
        assert page.evaluate("() => sessionStorage.getItem('localrun.apiKey')") == KEY
        assert KEY not in page.evaluate("() => JSON.stringify(localStorage)")  # kept for this tab only
        assert not [u for u in w.requests if KEY in u]  # a header, never in a URL
        assert not w.foreign_requests()
        assert all("401" in e for e in w.errors), w.errors  # the refusals above, nothing else
        w.page.context.close()
        # Another session asks again.
        other = open_page(browser, f"http://{lan or '127.0.0.1'}:{server.spec.port}/")
        other.page.wait_for_selector("#keygate", state="visible")
        other.page.context.close()
    finally:
        server.stop()
        hub.stop()


@needs_llama
def test_a_real_gguf_chats_in_the_page_and_its_refusal_of_an_image_is_shown(browser, tmp_path, smollm2_path):
    import_model(tmp_path, smollm2_path, "smollm2")
    server = _serve(tmp_path, "--ctx", "1024", LOCALRUN_RUNTIME__THREADS="1")
    try:
        w = open_page(browser, server.url + "/", width=1000, height=640)
        page = w.page
        page.wait_for_selector("body[data-ready=true]")
        page.click("#settings-toggle")
        page.fill("#max-tokens", "24")
        page.press("#max-tokens", "Tab")
        page.click("#settings-toggle")
        page.fill("#prompt", "Name three colors.")
        page.press("#prompt", "Enter")
        page.wait_for_selector("#stop", state="hidden", timeout=120_000)
        page.wait_for_selector("#stats >> text=tokens/s")
        answer = page.locator(".msg.assistant").last.inner_text()
        assert len(answer.split()) >= 3 and "failed" not in page.inner_text("#stats"), answer

        # What is loaded now: llama.cpp with its context, parallel slots and prompt cache.
        page.click("#tab-machine")
        row = page.locator("#loaded tbody tr", has_text="smollm2")
        row.wait_for()
        text = row.inner_text()
        assert "llama" in text and "\t1,024\t" in text and "slots held" in text and "tokens" in text, text
        page.click("#tab-chat")

        # An image to a model without a projector: the server's 400, in its words, in the page.
        url = "data:image/png;base64," + base64.b64encode(_png()).decode()
        direct = httpx.post(
            server.url + "/v1/chat/completions",
            json={
                "model": "smollm2",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this"},
                            {"type": "image_url", "image_url": {"url": url}},
                        ],
                    }
                ],
            },
            timeout=60,
        )
        assert direct.status_code == 400
        words = direct.json()["error"]["message"].split(" is an image", 1)[1]  # past the index, which differs
        image = tmp_path / "blue.png"
        image.write_bytes(_png())
        page.set_input_files("#file", str(image))
        page.fill("#prompt", "what is this")
        page.press("#prompt", "Enter")
        page.wait_for_selector(".msg.assistant.error")
        assert words in page.locator(".msg.assistant.error").inner_text()
        assert all("400" in e for e in w.errors), w.errors  # the refusal, nothing else
        assert not w.foreign_requests()
        if os.environ.get("LOCALRUN_DOCS_SCREENSHOT"):
            page.locator(".msg.assistant.error").evaluate("e => e.remove()")  # the README shows the chat
            page.locator(".msg.user").last.evaluate("e => e.remove()")
            page.locator("#stats").evaluate("e => { e.textContent = '' }")
            page.screenshot(path=str(REPO / "docs" / "web-app.png"))
        w.page.context.close()
    finally:
        server.stop()
