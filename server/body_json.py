"""A request body parsed as JSON without holding the event loop for long.

A JSON parse is one C call that holds the GIL from start to end: nothing else in the process runs,
the event loop included, and a thread does not help. Python's ``json.loads`` takes about 150 ms
for the largest body the media caps allow (32 images of 1 MiB in base64, a 43 MB body) on a
2-core box, and the lone-surrogate scan of the raw text (:func:`refuse_lone_surrogates`) 50 ms
more: ``/health`` and every other client waited that long. pydantic-core's parser (jiter, Rust)
reads the same body in about a third of the time and refuses every lone surrogate itself, so a
body it takes needs no scan; :mod:`localrun.server.json_pieces` runs it over the body's long
strings a megabyte at a time, in a worker thread (:func:`parse_checked`), so no single call holds
the GIL for more than a few milliseconds (20-50 ms measured on a loaded box, where json.loads
held it 110-180 ms).

The two parsers take the same documents with the same values, with three differences, each
resolved toward ``json.loads``'s answer:

* a number with a fraction or exponent is a float in jiter; :func:`parse_json` makes a whole one
  an int, as ``json.loads`` with :func:`_json_number` does (JSON Schema counts ``2.0`` an integer);
* jiter refuses what ``json.loads`` takes and localrun's checks refuse later or not at all (a lone
  surrogate, a UTF-8 BOM, UTF-16 text, nesting past 200): any failure of jiter's is answered by
  re-parsing with ``json.loads`` and its checks, so every refusal keeps its message and every
  document ``json.loads`` took is still taken;
* ``NaN``/``Infinity`` are refused by both (``allow_inf_nan=False``; ``_no_constant``).

:func:`read_body` reads the body without starlette's copy: ``Request.body()`` joins the one chunk
the server hands over with the empty one that ends the stream, a fresh 43 MB copy (tens of
milliseconds of the GIL, more on a loaded box).

Small bodies go straight to ``json.loads``: their parse is short, and their messages are the ones
the tests of hostile bodies pin.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, NoReturn

from starlette.requests import Request

from localrun.server.errors import InvalidRequest
from localrun.server.json_pieces import from_json_in_pieces
from localrun.server.validate import refuse_lone_surrogates, refuse_too_many_ids

#: Bodies at least this large are parsed by pydantic-core first (a few milliseconds of json.loads).
FAST_FROM = 256 * 1024


async def read_body(request: Request) -> bytes:
    """The request's body, the very bytes object the server read when it came in one piece."""
    chunks = [chunk async for chunk in request.stream() if chunk]
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def parse_checked(raw: bytes) -> Any:
    """:func:`parse_json` and the token-id count (:func:`refuse_too_many_ids`), in a worker thread
    for a large body: the scan of its long strings and the walks of its values are Python, which
    lets the loop's thread in between, and each C call of the parse is short."""
    if len(raw) < FAST_FROM:
        return _parse_checked(raw)
    return await asyncio.to_thread(_parse_checked, raw)


def _parse_checked(raw: bytes) -> Any:
    data = parse_json(raw)
    refuse_too_many_ids(raw, data)
    return data


def parse_json(raw: bytes, *, fast_from: int = FAST_FROM) -> Any:
    """``raw`` (``null`` when empty) as JSON, every string checked for lone surrogates; a 400 for a
    body that is not JSON, nests too deeply or holds a lone surrogate."""
    if len(raw) >= fast_from:
        try:
            data = from_json_in_pieces(raw)
        except ValueError:
            pass  # json.loads below decides, and says why in its own words
        else:
            return whole_floats(data)
    try:
        data = json.loads(raw or b"null", parse_constant=_no_constant, parse_float=_json_number)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest("the body nests too deeply", hint="send a flatter JSON document") from None
    refuse_lone_surrogates(raw, data)
    return data


def _json_number(text: str) -> int | float:
    """A JSON number with a fraction or exponent: an int when it is a whole number (``2.0``, ``1e3``),
    as JSON Schema counts it an integer, so strict validation takes it where an integer is asked."""
    value = float(text)
    return int(value) if value.is_integer() else value


def _no_constant(name: str) -> NoReturn:
    """NaN and Infinity are not JSON (Python's parser accepts them; clients' never send them)."""
    raise ValueError(f"{name} is not a JSON value")


def whole_floats(data: Any) -> Any:
    """``data`` with every whole float (``2.0``) an int, in place (iterative: bodies nest deep)."""
    if isinstance(data, float):
        return int(data) if data.is_integer() else data
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(value, float):
                    if value.is_integer():
                        item[key] = int(value)
                elif isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(item, list):
            for i, value in enumerate(item):
                if isinstance(value, float):
                    if value.is_integer():
                        item[i] = int(value)
                elif isinstance(value, (dict, list)):
                    stack.append(value)
    return data
