"""A large body's JSON parse holds the event loop for a fraction of what ``json.loads`` did, and
takes, refuses and words everything as before.

``json.loads`` on the largest body the media caps allow (32 images of 1 MiB in base64, 43 MB) is
one C call holding the GIL ~150 ms on a 2-core box, and the lone-surrogate scan another ~50 ms:
every other client of the server, ``/health`` included, waited. pydantic-core's parser is about
three times faster and refuses lone surrogates itself; a failure falls back to ``json.loads`` so
every message stays the same.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time

import pytest

from localrun.server.body_json import parse_json
from localrun.server.errors import InvalidRequest
from localrun.server.fields import parse_body
from server.openai.schemas import ChatCompletionRequest

#: Documents both parsers must read to the same value (or refuse with the same message).
DOCUMENTS = [
    b"",
    b"null",
    b"{}",
    b' {"a": [1, 2.0, -0.0, 1e3, 1.5, 1E2, -7710711.0, 1e400, -1e400, 1e-400]}\n',
    b'{"a": 1, "a": 2}',
    b"123456789012345678901234567890",
    b"123456789012345678901234567890.0",
    b'{"a": "\\ud83d\\ude00", "b": "\\u0000", "c": "\\/", "d": "\\\\ud800 is text"}',
    '{"é": "ü 😀"}'.encode(),
    b'"\\ud800"',
    b'{"messages": [{"content": "a\\udc00b"}]}',
    b'{"\\ud800": 1}',
    b'"\\ud800\\u0041"',
    b'"\xed\xa0\x80"',
    b'"\xff"',
    b"\xef\xbb\xbf{}",
    '{"a": 1}'.encode("utf-16"),
    b"NaN",
    b"[Infinity]",
    b'{"a": -Infinity}',
    b"{} x",
    b"[1,]",
    b'{"a":1,}',
    b"01",
    b"1.",
    b'"\\x"',
    b'"\t"',
    b"\x0c{}",
    b"[" * 300 + b"]" * 300,
    b"[" * 100_000 + b"]" * 100_000,
    b"[1e999999999999999999, 5e-324, 1.7976931348623157e308, 0.1]",
]


def _old_way(raw: bytes):
    """What parse_json answers without pydantic-core (every body, before)."""
    try:
        return "ok", parse_json(raw, fast_from=1 << 62)
    except InvalidRequest as exc:
        return "refused", str(exc), exc.hint


def _fast_way(raw: bytes):
    try:
        return "ok", parse_json(raw, fast_from=0)
    except InvalidRequest as exc:
        return "refused", str(exc), exc.hint


def _same(a, b) -> bool:
    """Equal, with types (2 is not 2.0) and NaN-free floats compared by value and sign."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


@pytest.mark.parametrize("raw", DOCUMENTS, ids=lambda r: repr(r[:24]))
def test_both_parsers_take_and_refuse_the_same_documents(raw):
    assert _same(_old_way(raw), _fast_way(raw))


def _random_documents(seed: int, count: int) -> list[bytes]:
    """Values full of what a lexer can trip on (quotes, backslashes, escapes, surrogates, control
    characters, emoji, repeated keys), some of them then damaged by one byte."""
    import random

    rng = random.Random(seed)
    alphabet = ["a", "b", '"', "\\", "\n", "\x01", "é", "😀", "\ud800", " ", "/", "\x7f"]

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))

    def value(depth: int = 0):
        roll = rng.random()
        if depth > 3 or roll < 0.3:
            return rng.choice([text(), rng.randint(-5, 5), rng.random(), 2.0, None, True])
        if roll < 0.65:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {rng.choice([text(), "k", "k"]): value(depth + 1) for _ in range(rng.randint(0, 4))}

    out = []
    for _ in range(count):
        raw = json.dumps(value(), ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        if rng.random() < 0.2:
            at = rng.randrange(len(raw) + 1)
            raw = raw[:at] + rng.choice([b'"', b"\\", b"x", b"\x00", b"\xff", b""]) + raw[at:]
        out.append(raw)
    return out


@pytest.mark.parametrize("piece", [1, 2, 3, 7])
def test_the_parse_in_pieces_is_pydantic_cores_parse(monkeypatch, piece):
    """Every string of 4 bytes or more lifted out and decoded ``piece`` bytes at a time: the same
    value as one pydantic-core call, or a ValueError where it fails."""
    import pydantic_core

    from localrun.server import json_pieces

    monkeypatch.setattr(json_pieces, "LONG", 4)
    monkeypatch.setattr(json_pieces, "PIECE", piece)
    for raw in DOCUMENTS + _random_documents(piece, 1500):
        try:
            whole = ("ok", pydantic_core.from_json(raw, allow_inf_nan=False))
        except ValueError:
            whole = ("refused",)
        try:
            pieces = ("ok", json_pieces.from_json_in_pieces(raw))
        except ValueError:
            pieces = ("refused",)
        assert _same(whole, pieces), raw


def test_a_large_body_with_a_lone_surrogate_is_refused_naming_where():
    data = base64.b64encode(bytes(1 << 20)).decode()
    raw = json.dumps({"model": "m", "images": [data, data + "\ud800"]}).encode()
    with pytest.raises(InvalidRequest, match=r"'images\.1'.*lone UTF-16 surrogate"):
        parse_json(raw)


def test_whole_floats_are_ints_as_before_in_a_large_body():
    raw = json.dumps({"pad": "x" * (1 << 19), "seed": 8.0, "t": 0.5, "n": [[2.0, {"k": 1e3}]]}).encode()
    data = parse_json(raw)
    assert _same(data["n"], [[2, {"k": 1000}]]) and _same(data["seed"], 8) and _same(data["t"], 0.5)


def _request(raw: bytes):
    from starlette.requests import Request

    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "query_string": b""}
    return Request(scope, receive)


def _longest_gil_hold(work) -> float:
    """The longest pause of a thread that ticks every millisecond while ``work`` runs: one C call
    holding the GIL stops it, as it stops the event loop."""
    stop = threading.Event()
    gaps = [0.0]

    def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps[0] = max(gaps[0], now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.02)
    gaps[0] = 0.0
    try:
        work()
    finally:
        stop.set()
        ticker.join()
    return gaps[0]


def test_the_largest_image_request_holds_the_gil_a_fraction_of_json_loads():
    """32 images of 1 MiB (the caps' largest request): parse_body's longest GIL hold is well under
    json.loads's on the same body, measured side by side so a slow or loaded box scales both."""
    image = base64.b64encode(bytes(1 << 20)).decode()
    parts = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}} for _ in range(32)]
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": parts}]}).encode()

    async def parse() -> None:
        await parse_body(_request(raw), ChatCompletionRequest)  # None back: a task's repr shows its result

    reference, ours = [], []
    for _ in range(3):
        reference.append(_longest_gil_hold(lambda: json.loads(raw)))
        ours.append(_longest_gil_hold(lambda: asyncio.run(parse())))
    best_reference, best_ours = min(reference), min(ours)
    assert best_ours < 0.6 * best_reference, (
        f"parse_body held the GIL {best_ours * 1000:.0f} ms at once; json.loads alone {best_reference * 1000:.0f} ms"
    )
