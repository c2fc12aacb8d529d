"""Every malformed image and clip of tests/support/bad_media.py through every API family of a real
server (Gemma 3 270M + the tiny fixture projector on llama.cpp): each answer a 4xx with a message,
never a 5xx or a dropped connection, and afterwards the same worker still answers a good image
and a text request.

Where an item goes: a case that is bad only because of its declared MIME is sent only where a
MIME travels (OpenAI and Responses data URLs, Anthropic's ``media_type``); a valid image put in an
audio field only where an API has one (OpenAI's ``input_audio``). Everything else goes
everywhere: Ollama and llama-server take bare base64, so a URL case is sent to them as the
"base64" it is not.

The CI run sends every case once per family, non-streamed, concurrently: the door refuses most
of them in microseconds; those it lets through (truncated and corrupt bodies: their headers are
fine) each cost a trip to the runtime's decoder, so in CI each of those goes to one family in
turn (every family gets a share; the wire is what differs between families, the decoder is one).
Then a sample streamed and a sample behind a good image (a request that fails after another
item was already accepted must free it).
The long run (``-m long``) sends the whole corpus five ways: streamed and not, alone and behind a
good image, and twice in one request.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.conftest import needs_llama
from tests.support import bad_media
from tests.support.servers import health
from tests.support.vision_serve import (
    AUDIO_SLOT_FAMILIES,
    FAMILIES,
    MIME_FAMILIES,
    b64,
    error_message,
    good_image,
    request,
    start_vision_server,
)


def real_server(test):
    """The marks of a test on the real server (the corpus test needs none of them)."""
    for mark in (needs_llama, pytest.mark.llama, pytest.mark.gemma, pytest.mark.slow):
        test = mark(test)
    return test


CONCURRENCY = 6  # under the server's queue (16): a full queue's 503 would be the test's doing


@pytest.fixture(scope="module")
def server(tmp_path_factory, gemma_gguf):
    vision = pytest.importorskip("tests.support.vision")
    projector = vision.vision_projector(vision.TINY)
    srv = start_vision_server(tmp_path_factory.mktemp("fuzz-home"), gemma_gguf, projector)
    yield srv
    srv.stop()


def _good_png() -> tuple[str, str]:
    return b64(good_image("PNG")), "image/png"


def _families(case: bad_media.Case) -> tuple[str, ...]:
    if case.needs == bad_media.NEEDS_MIME:
        return MIME_FAMILIES
    if case.needs == bad_media.NEEDS_AUDIO_SLOT:
        return AUDIO_SLOT_FAMILIES
    return FAMILIES


#: Groups whose items pass the door's header checks and so each cost a trip to the runtime's
#: decoder: in CI each goes to one family (in turn), the long run sends them everywhere.
DECODER_GROUPS = frozenset({"truncated", "corrupt_body"})


def _sends(cases, *, stream: bool = False, before: int = 0, twice: bool = False, rotate: bool = False):
    good = _good_png()
    for i, case in enumerate(cases):
        families = _families(case)
        if rotate and case.group in DECODER_GROUPS:
            families = (families[i % len(families)],)
        for family in families:
            if before and case.needs == bad_media.NEEDS_AUDIO_SLOT:
                continue
            path, body = request(
                family,
                b64_data=case.b64,
                mime=case.mime,
                url=case.url,
                audio=case.slot == bad_media.AUDIO,
                stream=stream,
                before=(good,) * before,
            )
            if twice:  # the same bad item again, after the first (two media in one message)
                path, body = request(
                    family,
                    b64_data=case.b64,
                    mime=case.mime,
                    url=case.url,
                    audio=case.slot == bad_media.AUDIO,
                    stream=stream,
                    before=((case.b64, case.mime),) if case.url is None and case.slot == bad_media.IMAGE else (),
                )
            yield case, family, path, body


async def _fire(url: str, sends) -> list[str]:
    """Send everything, CONCURRENCY at a time; return one line per wrong answer."""
    problems: list[str] = []
    sem = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one(case, family, path, body):
            async with sem:
                try:
                    r = await client.post(path, json=body)
                except httpx.TransportError as exc:
                    problems.append(f"{case.tag} {family}: connection {type(exc).__name__}: {exc}")
                    return
            try:
                message = error_message(r.json())
            except json.JSONDecodeError:
                message = ""
            if not 400 <= r.status_code < 500 or not message:
                problems.append(f"{case.tag} {family}: {r.status_code} {r.text[:200]!r}")

        await asyncio.gather(*(one(*send) for send in sends))
    return problems


def _text(url: str) -> httpx.Response:
    body = {"model": "gemma-vision", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def _worker_pid(url: str) -> int:
    """The model's worker process (loaded first by a text request: the fuzz must not be its load)."""
    if not health(url)["models"]:
        assert _text(url).status_code == 200
    return health(url)["models"][0]["pid"]


def _assert_alive(url: str, pid: int) -> None:
    path, body = request("openai", b64_data=_good_png()[0], mime="image/png", max_tokens=2)
    good = httpx.post(url + path, json=body, timeout=120)
    assert good.status_code == 200, good.text
    text = _text(url)
    assert text.status_code == 200, text.text
    assert good.json()["usage"]["prompt_tokens"] > text.json()["usage"]["prompt_tokens"]
    assert _worker_pid(url) == pid, "the worker was replaced: a malformed file crashed it"


def test_the_corpus_is_big_deterministic_and_tagged():
    cases = bad_media.cases()
    assert len(cases) >= 500
    assert len({c.tag for c in cases}) == len(cases)
    groups = {c.group for c in cases}
    assert groups >= {"truncated", "wrong_magic", "corrupt_body", "huge_dims", "empty", "base64", "data_url"}
    assert groups >= {"wrong_kind", "wav", "mp3"}
    bad_media.cases.cache_clear()
    bad_media.sources.cache_clear()
    assert bad_media.cases() == cases  # rebuilt from nothing: the same list


@real_server
def test_every_malformed_item_on_every_api_is_a_4xx_with_a_message(server):
    pid = _worker_pid(server.url)
    cases = bad_media.cases()
    sends = list(_sends(cases, rotate=True))
    problems = asyncio.run(_fire(server.url, sends))
    # A sample streamed, and a sample behind a good image (the good one is decoded, then freed).
    sample = cases[::9]
    problems += asyncio.run(_fire(server.url, _sends(sample, stream=True)))
    problems += asyncio.run(_fire(server.url, _sends(sample, before=1)))
    assert not problems, f"{len(problems)} of {len(sends)} wrong:\n" + "\n".join(problems[:40])
    _assert_alive(server.url, pid)


@real_server
@pytest.mark.long
def test_the_corpus_five_ways(server):
    pid = _worker_pid(server.url)
    cases = bad_media.cases()
    problems: list[str] = []
    for way in ({}, {"stream": True}, {"before": 1}, {"before": 1, "stream": True}, {"twice": True}):
        problems += asyncio.run(_fire(server.url, _sends(cases, **way)))
    assert not problems, f"{len(problems)} wrong:\n" + "\n".join(problems[:60])
    _assert_alive(server.url, pid)
