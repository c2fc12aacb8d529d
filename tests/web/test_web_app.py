"""The web app in a real browser (Debian's chromium through playwright) against a real server on the
fake runtime: chat with streaming, stop, images, conversations kept across a reload; a pull from the
fake hub with live progress, load and unload; model answers that try to run script run nothing; every
request stays on the page's origin and the console stays clean.

One server and one browser for the module; each test opens its own context (its own storage).
"""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import pytest

from tests.factories import write_tiny_llama_gguf
from tests.hub.fakehub import FakeHub
from tests.hub.repos import make_gguf, populate
from tests.server.test_reasoning import THINK_TEMPLATE
from tests.support.servers import free_port, import_model, launcher, start
from tests.web.conftest import open_page

pytestmark = pytest.mark.slow

WORDS = 300  # filler words after the echo: 6 s at 20 ms a word, unless max_tokens or Stop cuts it
THINK_WORDS = 5  # the reasoning every fake answer opens with
ASSISTANT = ".msg.assistant"


PULLED_REPO = "testorg/Web-GGUF"
PULLED_FILE = "Web-Q4_K_M.gguf"


@pytest.fixture(scope="module")
def hub():
    started = populate(FakeHub()).start()
    # 1 MiB, sent in 64 KiB steps when throttled: a pull slow enough to watch its progress move.
    started.add_repo(PULLED_REPO, {PULLED_FILE: make_gguf(payload=1 << 20, name="web")}, tags=("gguf",))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, hub):
    home = tmp_path_factory.mktemp("webhome")
    import_model(home, write_tiny_llama_gguf(home / "tiny.gguf"), "tiny")
    # A reasoning model: its template has a reasoning format, so the server splits the fake's <think> off
    # (tiny's template has none: its answers keep the <think> words as text, which the tests allow for).
    import_model(home, write_tiny_llama_gguf(home / "thinker.gguf", chat_template=THINK_TEMPLATE), "thinker")
    options = {
        "fake_delay_s": 0.02,
        "fake_reply_words": WORDS,
        "fake_capabilities": ["vision"],
        "fake_think_words": THINK_WORDS,
    }
    spec = launcher(free_port(), home=home, options=options)
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "LOCALRUN_HUB__ENDPOINT"):
        spec.env.pop(var, None)
    spec.env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1", LOCALRUN_SERVER__MIRROR="true")
    # An upstream that is not there (nothing listens on port 9): the Models view shows it down.
    spec.env["LOCALRUN_UPSTREAMS"] = json.dumps([{"name": "elsewhere", "url": "http://127.0.0.1:9/v1"}])
    proc = start(spec, home / "server.log")
    yield proc
    proc.stop()


def ready(w):
    w.page.wait_for_selector("body[data-ready=true]", timeout=15_000)
    return w.page


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def wait_answer_done(page, contains: str) -> str:
    page.wait_for_function(
        "(t) => { const a = [...document.querySelectorAll('.msg.assistant')].pop();"
        " return a && a.textContent.includes(t) && document.querySelector('#stop').hidden; }",
        arg=contains,
        timeout=20_000,
    )
    return page.locator(ASSISTANT).last.inner_text()


def clean(w) -> None:
    assert not w.errors, w.errors
    assert not w.foreign_requests(), w.foreign_requests()


def test_chat_streams_stops_and_conversations_survive_a_reload(browser, server):
    w = open_page(browser, server.url + "/")
    page = ready(w)
    assert page.locator("#model option").evaluate_all("os => os.map(o => o.value)") == ["thinker", "tiny"]
    page.select_option("#model", "tiny")
    # Per-conversation settings: a short answer (max tokens) and a system prompt.
    page.click("#settings-toggle")
    page.fill("#system", "Be brief.")
    page.press("#system", "Tab")
    page.fill("#max-tokens", "16")
    page.press("#max-tokens", "Tab")
    send(page, "hello there\nsecond line")
    text = wait_answer_done(page, "You said:")
    assert "hello there" in text
    stats = page.inner_text("#stats")
    assert "16 tokens" in stats and "tokens/s" in stats and "cached" in stats, stats

    # A long answer, stopped with Esc while it streams.
    page.click("#new-chat")
    send(page, "tell me everything")
    page.wait_for_selector("#stop", state="visible")
    page.wait_for_function("() => document.querySelector('.msg.assistant .body').textContent.split(' ').length > 12")
    page.keyboard.press("Escape")
    page.wait_for_selector("#stop", state="hidden")
    stopped = page.locator(ASSISTANT).last.inner_text()
    assert "stopped" in stopped and len(stopped.split()) < WORDS, stopped
    # the server stops generating too, once it sees the stream's reader gone (a moment on a busy machine)
    deadline = time.monotonic() + 10
    while httpx.get(server.url + "/health", timeout=5).json()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.get(server.url + "/health", timeout=5).json()["in_flight"] == 0

    # Both conversations are there after a reload, the current one first.
    page.reload()
    ready(w)
    titles = page.locator("#convo-list button").all_inner_texts()
    assert titles == ["tell me everything", "hello there"], titles
    assert "stopped" in page.locator(ASSISTANT).last.inner_text()
    page.click("#convo-list button >> text=hello there")
    assert page.input_value("#max-tokens") == "16" and page.input_value("#system") == "Be brief."
    assert "You said: hello there" in page.locator(ASSISTANT).last.inner_text()

    w.answer = "Renamed <b>chat</b>"
    page.click("#rename")
    page.wait_for_selector("#convo-list button >> text=Renamed <b>chat</b>")
    with page.expect_download() as download:
        page.click("#export")
    exported = json.loads(open(download.value.path()).read())
    assert exported["title"] == "Renamed <b>chat</b>" and exported["max_tokens"] == 16
    assert [m["role"] for m in exported["messages"]] == ["user", "assistant"]
    page.click("#delete")
    page.wait_for_function("() => document.querySelectorAll('#convo-list li').length === 1")
    clean(w)
    w.page.context.close()


def test_a_reasoning_models_thinking_is_shown_apart_and_folded(browser, server):
    w = open_page(browser, server.url + "/")
    page = ready(w)
    page.select_option("#model", "thinker")
    assert "thinking" in page.inner_text("#model-caps")
    page.click("#settings-toggle")
    page.fill("#max-tokens", "20")
    page.press("#max-tokens", "Tab")
    send(page, "why is the sky blue")
    wait_answer_done(page, "You said: why is the sky blue")
    answer = page.locator(ASSISTANT).last
    think = answer.locator("details.think")
    assert think.get_attribute("open") is None  # folded
    body = answer.locator(".body").inner_text()
    assert "think>" not in body and body.startswith("You said:"), body
    think.locator("summary").click()
    reasoning = think.locator("div").inner_text()
    assert len(reasoning.split()) == THINK_WORDS and reasoning.strip() not in body, reasoning
    page.reload()
    ready(w)
    assert page.input_value("#model") == "thinker"  # the conversation keeps its model
    assert page.locator(f"{ASSISTANT} details.think").count() == 1
    clean(w)
    w.page.context.close()


HOSTILE = (
    '<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> '
    '[click me](javascript:window.pwned=3) <a href="javascript:window.pwned=4">x</a> '
    "![pic](http://example.com/x.png) [ok](https://example.org/) **bold** `code`"
)


def test_a_model_answer_holding_html_and_script_runs_nothing(browser, server):
    w = open_page(browser, server.url + "/")
    page = ready(w)
    page.click("#settings-toggle")
    page.fill("#max-tokens", "60")
    page.press("#max-tokens", "Tab")
    send(page, HOSTILE)
    text = wait_answer_done(page, "You said:")
    assert "<img src=x onerror=" in text and "<script>" in text  # shown as the characters they are
    answer = page.locator(ASSISTANT).last
    assert answer.locator("img, script, iframe, object").count() == 0
    assert page.locator(".msg.user img, .msg.user script").count() == 0
    hrefs = answer.locator("a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert hrefs == ["http://example.com/x.png", "https://example.org/"], hrefs  # the image is a link, not loaded
    assert answer.locator("strong").inner_text() == "bold" and answer.locator("code").inner_text() == "code"
    answer.get_by_text("click me").click()  # plain text: clicking it goes nowhere
    assert page.evaluate("() => window.pwned") is None
    assert page.url == server.url + "/"
    clean(w)
    w.page.context.close()


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 6), "red").save(out, format="PNG")
    return out.getvalue()


def test_an_image_reaches_a_model_that_sees(browser, server, tmp_path):
    image = tmp_path / "red.png"
    image.write_bytes(_png())
    w = open_page(browser, server.url + "/")
    page = ready(w)
    page.click("#settings-toggle")
    page.fill("#max-tokens", "30")
    page.press("#max-tokens", "Tab")
    page.set_input_files("#file", str(image))  # by the button
    page.wait_for_selector("#attachments img")
    # by pasting and by dropping: the events a browser fires, carrying the same file
    for kind in ("paste", "drop"):
        page.evaluate(
            """async ([kind, b64]) => {
                const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
                const data = new DataTransfer();
                data.items.add(new File([bytes], kind + ".png", { type: "image/png" }));
                const target = document.getElementById(kind === "paste" ? "prompt" : "composer");
                const event = kind === "paste"
                    ? new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true })
                    : new DragEvent("drop", { dataTransfer: data, bubbles: true, cancelable: true });
                target.dispatchEvent(event);
            }""",
            [kind, base64.b64encode(image.read_bytes()).decode()],
        )
    page.wait_for_function("() => document.querySelectorAll('#attachments img').length === 3")
    names = page.locator("#attachments figcaption").all_inner_texts()
    assert sorted(names) == ["drop.png", "paste.png", "red.png"], names  # read in parallel: any order
    send(page, "what is this")
    text = wait_answer_done(page, "[media:")
    assert text.count("image/png") == 3, text
    assert page.locator(".msg.user img.thumb").count() == 3
    assert page.locator("#attachments img").count() == 0
    clean(w)
    w.page.context.close()


def test_pull_from_the_hub_with_progress_then_load_and_unload(browser, server, hub):
    size = len(hub.file(PULLED_REPO, PULLED_FILE).data)
    hub.faults.throttle_bps = size / 2  # two seconds: long enough to watch it move
    w = open_page(browser, server.url + "/")
    page = ready(w)
    page.click("#tab-machine")
    page.wait_for_selector("#models table")
    page.fill("#pullref", PULLED_REPO + ":Q4_K_M")
    page.press("#pullref", "Enter")
    page.wait_for_function(
        "() => { const p = document.querySelector('#pulls progress'); return p && p.value > 0 && p.value < p.max; }",
        timeout=15_000,
    )
    assert " of " in page.inner_text("#pulls")  # bytes done of the total, as it goes
    page.wait_for_selector("#pulls >> text=: done", timeout=30_000)
    hub.faults.throttle_bps = None
    page.wait_for_function("() => document.querySelectorAll('#models tbody tr').length === 3")
    assert page.locator("#model option").count() == 3  # the chat's picker has it too

    assert page.inner_text("#hubinfo") == f"From {hub.url}"
    page.wait_for_selector("#mirror >> text=(1 pulled from a hub)")  # serve --mirror: the pulled model is shared
    assert f"HF_ENDPOINT={server.url}" in page.inner_text("#mirror")
    page.wait_for_selector("#upstreams >> text=down")
    assert "elsewhere" in page.inner_text("#upstreams") and "127.0.0.1:9" in page.inner_text("#upstreams")
    names = page.locator("#models tbody tr td:first-child").all_inner_texts()
    [pulled] = [n for n in names if n not in ("tiny", "thinker")]
    assert "web" in pulled.lower(), names
    page.click(f"#models button[aria-label='Load {pulled}']")
    row = page.locator("#loaded tbody tr", has_text=pulled)
    row.wait_for()
    assert "fake" in row.inner_text() and "\t256\t" in row.inner_text(), row.inner_text()  # runtime, context
    row.locator(f"button[aria-label='Unload {pulled}']").click()
    row.wait_for(state="detached")
    assert page.locator(f"#models button[aria-label='Load {pulled}']").is_visible()
    page.click(f"#models button[aria-label='Remove {pulled}']")  # confirm() is accepted
    page.locator("#models tbody tr", has_text=pulled).wait_for(state="detached")
    # the chat's picker follows once the page has re-read the catalog (a moment later on a busy machine)
    page.wait_for_function("() => document.querySelectorAll('#model option').length === 2", timeout=15_000)
    assert pulled not in httpx.get(server.url + "/v1/models", timeout=5).text
    clean(w)
    w.page.context.close()


def test_usable_at_360_px_in_the_dark(browser, server):
    light = open_page(browser, server.url + "/")
    background = "() => getComputedStyle(document.body).backgroundColor"
    light_bg = ready(light).evaluate(background)
    light.page.context.close()
    w = open_page(browser, server.url + "/", width=360, height=740, color_scheme="dark")
    page = ready(w)
    assert page.evaluate(background) != light_bg  # the system's dark setting is followed
    wide = "() => document.documentElement.scrollWidth <= window.innerWidth"
    assert page.evaluate(wide)
    assert page.locator("#sidebar").is_hidden()  # folded behind the menu button
    page.click("#menu")
    assert page.locator("#new-chat").is_visible()
    page.click("#new-chat")
    page.click("#tab-machine")
    page.wait_for_selector("#models table")
    assert page.evaluate(wide)
    clean(w)
    w.page.context.close()


MARKDOWN = """# Title
Some *em*, **strong**, ~~gone~~ and `a < b` inline.

```python
print("<b>hi</b>")
```

- one
- two with [a link](https://example.org/a?b=1)
  - nested

1. first
2. second

> quoted **text**

| a | b |
|---|---|
| <i>x</i> | 2 |

[bad](JaVaScRiPt:alert(1)) [data](data:text/html,<script>alert(1)</script>) [rel](/admin/status) <https://ok.example/>
"""


def test_the_markdown_renderer_builds_elements_and_keeps_only_safe_links(browser, server):
    w = open_page(browser, server.url + "/")
    page = ready(w)
    shape = page.evaluate(
        """async (text) => {
            const { render } = await import("/web/markdown.js");
            const box = document.createElement("div");
            box.append(render(text));
            const tags = (sel) => [...box.querySelectorAll(sel)].map((e) => e.textContent);
            return {
                h: tags("h3"), em: tags("em"), strong: tags("strong"), del: tags("del"), code: tags("p code"),
                pre: tags("pre code"), lang: box.querySelector("pre code").dataset.lang,
                ul: box.querySelectorAll(":scope > ul > li").length, nested: tags("ul ul li"), ol: tags("ol li"),
                quote: tags("blockquote strong"), cells: tags("td"), italics: box.querySelectorAll("i").length,
                links: [...box.querySelectorAll("a")].map((a) => [a.textContent, a.getAttribute("href"), a.rel]),
                text: box.textContent,
            };
        }""",
        MARKDOWN,
    )
    assert shape["h"] == ["Title"] and shape["em"] == ["em"] and shape["del"] == ["gone"]
    assert shape["code"] == ["a < b"] and shape["pre"] == ['print("<b>hi</b>")'] and shape["lang"] == "python"
    assert shape["ul"] == 2 and shape["nested"] == ["nested"] and shape["ol"] == ["first", "second"]
    assert shape["quote"] == ["text"] and shape["cells"] == ["<i>x</i>", "2"] and shape["italics"] == 0
    assert [link[:2] for link in shape["links"]] == [
        ["a link", "https://example.org/a?b=1"],
        ["https://ok.example/", "https://ok.example/"],
    ]  # javascript:, data: and relative targets stay text
    assert all("noopener" in link[2] for link in shape["links"])
    assert "bad (JaVaScRiPt:alert(1))" in shape["text"] and "rel (/admin/status)" in shape["text"]
    clean(w)
    w.page.context.close()
