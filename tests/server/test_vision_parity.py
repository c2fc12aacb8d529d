"""llama-server's own vision tests, against localrun: the cases of
``tools/server/tests/unit/test_vision_api.py`` (vendored llama.cpp of llama-cpp-python 0.3.36) where
the protocol is the same, on a real server (Gemma 3 270M + the tiny fixture projector).

Their model is tinygemma3 trained on CIFAR-10, so their tests match "cat" or "frog" in the answer;
ours is a random-weight projector whose answers are noise, so where they match words we check
what is real: the answer is a 200 with text, image tokens are counted, two images give different
logits and the same image the same ones.

Where localrun differs, by choice:

* **Remote image URLs are off by default** (``server.fetch_image_urls`` empty): a server that
  fetches any URL it is sent is an SSRF hole. llama-server fetches ``IMG_URL_0`` from the
  internet; here the module's server allows one host, 127.0.0.1, and the images come from a
  local HTTP server, so the same cases run offline (a host not on the list is a 400 that says how
  to allow it). Their "https://google.com/404" and "https://ggml.ai" cases become a local 404 and
  a local HTML page.
* **Failures are 400 with a message**, where llama-server's tests only ask for "not 200".
* **Capabilities**: llama-server's ``/models`` and ``/v1/models`` carry a ``models`` list with
  ``"multimodal"`` in ``capabilities`` (its Ollama-style listing). localrun's ``/v1/models`` is
  OpenAI's list; the same fact is in ``/props`` (``modalities``, llama-server's own shape), in
  ``/api/show`` (Ollama's ``capabilities``, with ``vision``), and in the ``/v1/models`` entry.
* **Token count**: llama-server's ``/chat/completions/input_tokens`` is not a localrun route; the
  count is asserted through ``usage.prompt_tokens`` and Anthropic's ``/v1/messages/count_tokens``.
* **Embeddings with images** (``test_vision_embeddings``, ``test_vision_embeddings_oai_content``)
  are not covered: issue 19 asks for media in generation, not in embeddings.
* **Routes**: their ``/completions`` alias is ``/completion`` and ``/v1/completions`` here.
"""

from __future__ import annotations

import http.server
import threading

import httpx
import pytest

from tests.conftest import needs_llama
from tests.support.vision_serve import MODEL, b64, good_image, start_vision_server

pytestmark = [needs_llama, pytest.mark.llama, pytest.mark.gemma, pytest.mark.slow]

IMG_0 = good_image("PNG", (48, 32), seed=11)  # their 11_truck.png
IMG_1 = good_image("PNG", (48, 32), seed=91)  # their 91_cat.png
PAGES = {"/11_truck.png": (IMG_0, "image/png"), "/91_cat.png": (IMG_1, "image/png")}
PAGES["/index.html"] = (b"<!doctype html><html><body>ggml.ai</body></html>", "text/html")


class _Pages(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        found = PAGES.get(self.path)
        self.send_response(200 if found else 404)
        body, mime = found or (b"not found", "text/plain")
        self.send_header("Content-Type", mime)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet: the test's output is the assertions
        pass


@pytest.fixture(scope="module")
def pages():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def server(tmp_path_factory, gemma_gguf):
    vision = pytest.importorskip("tests.support.vision")
    projector = vision.vision_projector(vision.TINY)
    home = tmp_path_factory.mktemp("parity-home")
    srv = start_vision_server(
        home, gemma_gguf, projector, env_extra={"LOCALRUN_SERVER__FETCH_IMAGE_URLS": '["127.0.0.1"]'}
    )
    load = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert httpx.post(f"{srv.url}/v1/chat/completions", json=load, timeout=600).status_code == 200
    yield srv
    srv.stop()


def img_url(name: str, pages: str) -> str:
    """Their ``get_img_url``: URL, data URI or bare base64 of their two images, or the name itself."""
    port = pages.rsplit(":", 1)[-1]
    return {
        "IMG_URL_0": f"{pages}/11_truck.png",
        "IMG_URL_1": f"{pages}/91_cat.png",
        "IMG_BASE64_URI_0": "data:image/png;base64," + b64(IMG_0),
        "IMG_BASE64_0": b64(IMG_0),
        "IMG_BASE64_URI_1": "data:image/png;base64," + b64(IMG_1),
        "IMG_BASE64_1": b64(IMG_1),
        "NOT_FOUND": f"{pages}/404",
        "HTML_PAGE": f"{pages}/index.html",
        "HOST_NOT_ALLOWED": f"http://localhost:{port}/11_truck.png",
    }.get(name, name)


def chat(server, prompt: str, url: str, **extra) -> httpx.Response:
    body = {
        "model": MODEL,
        "temperature": 0.0,
        "top_k": 1,
        "max_tokens": 4,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": prompt}, {"type": "image_url", "image_url": {"url": url}}],
            }
        ],
        **extra,
    }
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)


def _message(r: httpx.Response) -> str:
    error = r.json().get("error")
    return error.get("message", "") if isinstance(error, dict) else str(error or "")


def test_props_and_show_say_the_model_sees(server):
    props = httpx.get(f"{server.url}/props", params={"model": MODEL}, timeout=30).json()
    assert props["modalities"]["vision"] is True
    assert props["modalities"]["audio"] is False
    show = httpx.post(f"{server.url}/api/show", json={"model": MODEL}, timeout=30).json()
    assert "completion" in show["capabilities"] and "vision" in show["capabilities"]


def test_v1_models_entry_says_it(server):
    entries = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    entry = next(e for e in entries if e["id"] == MODEL)
    assert "vision" in str(entry), entry


@pytest.mark.parametrize(
    "prompt, image, success",
    [
        ("What is this:\n", "IMG_URL_0", True),
        ("What is this:\n", "IMG_BASE64_URI_0", True),
        ("What is this:\n", "IMG_URL_1", True),
        ("Test test\n", "IMG_URL_1", True),  # theirs: test invalidate cache
        ("What is this:\n", "malformed", False),
        ("What is this:\n", "NOT_FOUND", False),  # theirs: https://google.com/404
        ("What is this:\n", "HTML_PAGE", False),  # theirs: https://ggml.ai, non-image data
        ("What is this:\n", "data:text/html;base64,aGVsbG8=", False),  # unsupported data uri mime
        ("What is this:\n", "HOST_NOT_ALLOWED", False),  # ours: a host fetch_image_urls does not name
    ],
)
def test_vision_chat_completion(server, pages, prompt, image, success):
    r = chat(server, prompt, img_url(image, pages))
    if success:
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str)
    else:
        assert 400 <= r.status_code < 500, r.text
        assert _message(r)


def test_a_host_not_allowed_says_how_to_allow_it(server, pages):
    r = chat(server, "What is this:\n", img_url("HOST_NOT_ALLOWED", pages))
    assert r.status_code == 400
    assert "fetch_image_urls" in _message(r)


def test_vision_chat_completion_token_count(server):
    text_only = httpx.post(
        f"{server.url}/v1/messages/count_tokens",
        json={"model": MODEL, "messages": [{"role": "user", "content": "What is this:"}]},
        timeout=300,
    ).json()["input_tokens"]
    with_image = httpx.post(
        f"{server.url}/v1/messages/count_tokens",
        json={
            "model": MODEL,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this:"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(IMG_0)}},
                    ],
                }
            ],
        },
        timeout=300,
    )
    assert with_image.status_code == 200, with_image.text
    assert with_image.json()["input_tokens"] > text_only + 10
    usage = chat(server, "What is this:", img_url("IMG_BASE64_URI_0", "")).json()["usage"]
    assert usage["prompt_tokens"] > 10


def _first_logprobs(server, url: str) -> dict[str, float]:
    r = chat(server, "What is this:\n", url, max_tokens=1, logprobs=True, top_logprobs=5)
    assert r.status_code == 200, r.text
    top = r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return {t["token"]: t["logprob"] for t in top}


def test_two_images_give_different_logits_and_one_image_the_same(server):
    """Their 'test invalidate cache' (IMG_URL_1 after IMG_URL_0): the KV of the first image must
    not answer for the second; the second again, after the first, answers as it did."""
    one = _first_logprobs(server, img_url("IMG_BASE64_URI_1", ""))
    zero = _first_logprobs(server, img_url("IMG_BASE64_URI_0", ""))
    again = _first_logprobs(server, img_url("IMG_BASE64_URI_1", ""))
    assert zero != one
    assert again.keys() == one.keys()
    assert all(abs(again[k] - one[k]) < 1e-3 for k in one)


@pytest.mark.parametrize("route", ["/completion", "/v1/completions"])
@pytest.mark.parametrize(
    "prompt, image, success",
    [
        ("What is this: <__media__>\n", "IMG_BASE64_0", True),
        ("What is this: <__media__>\n", "IMG_BASE64_1", True),
        ("What is this: <__media__>\n", "malformed", False),  # non-image data
        ("What is this:\n", "", False),  # empty string
    ],
)
def test_vision_completion(server, route, prompt, image, success):
    body = {
        "temperature": 0.0,
        "top_k": 1,
        "prompt": {"prompt_string": prompt, "multimodal_data": [img_url(image, "")]},
    }
    body["n_predict" if route == "/completion" else "max_tokens"] = 4
    if route == "/v1/completions":
        body["model"] = MODEL
    r = httpx.post(f"{server.url}{route}", json=body, timeout=300)
    if success:
        assert r.status_code == 200, r.text
        answer = r.json()
        assert isinstance(answer["content"] if route == "/completion" else answer["choices"][0]["text"], str)
        tokens = answer["tokens_evaluated"] if route == "/completion" else answer["usage"]["prompt_tokens"]
        assert tokens > 10  # the image's tokens are in the prompt count
    else:
        assert 400 <= r.status_code < 500, r.text
        assert _message(r)


def test_apply_template_keeps_the_image_where_it_stood(server):
    """/apply-template shows the prompt a chat with an image renders to, the media marker in the
    image's place (llama-server's prompt shows it the same way); before, the image part was dropped."""
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "before "},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(IMG_0)}},
                {"type": "text", "text": " after"},
            ],
        }
    ]
    r = httpx.post(f"{server.url}/apply-template", json={"model": MODEL, "messages": messages}, timeout=60)
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "before <__media__> after" in prompt, prompt
    bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    r = httpx.post(f"{server.url}/apply-template", json={"model": MODEL, "messages": bad}, timeout=60)
    assert r.status_code == 400 and _message(r), r.text
