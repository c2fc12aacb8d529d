"""Checks every parsed request body gets before its schema, whatever its route.

A JSON string may carry a lone UTF-16 surrogate (``"\\ud800"``): Python's parser accepts
it, but the string is not Unicode text, so it cannot be encoded for a tokenizer, a worker's
pipe or a log line, and every such place used to fail with a 500. llama-server refuses the
whole body (its JSON parser rejects a lone surrogate); so does localrun, with a 400 naming
where the surrogate is, on every route at once because :func:`server.fields.parse_body`
calls :func:`refuse_lone_surrogates` for all of them.
"""

from __future__ import annotations

import re
from typing import Any

from localrun.frames import MAX_HEADER_BYTES
from localrun.server.errors import BodyTooLarge, InvalidRequest

#: The most numbers one request may carry in lists (token ids: Ollama's ``context``, token-array
#: prompts and embedding inputs), all fields together. A request crosses to its worker as one frame
#: whose JSON header is bounded by frames.MAX_HEADER_BYTES (64 MiB); an id takes up to 11 bytes
#: there (10 digits and a comma), so a sixteenth of the bound (4 Mi ids, at most 44 MiB) leaves
#: room for the request's text. Past it the worker pipe refused the frame, or, worse, the worker
#: died with everything in flight; no model reads more tokens than this in one request.
MAX_TOKEN_IDS = MAX_HEADER_BYTES // 16

#: A ``\\u`` escape in the surrogate range (D800–DFFF), or a surrogate written as UTF-8 bytes
#: (``ED A0``–``ED BF``: not valid UTF-8, but Python's parser decodes a body with ``surrogatepass``).
#: Surrogates reach a parsed string only through one of these, so a body without them needs no walk.
_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def refuse_lone_surrogates(raw: bytes, data: Any) -> None:
    """A 400 naming the first string (value or key) of ``data`` that holds a lone surrogate.

    A proper pair (``"\\ud83d\\ude00"``) is joined into one character by the parser and passes.
    """
    if not _ESCAPE.search(raw):
        return
    where = _find(data, ())
    if where is None:
        return
    loc = ".".join(str(p) for p in where) or "body"
    raise InvalidRequest(
        f"invalid value for {loc!r}: the text holds a lone UTF-16 surrogate escape (\\ud800–\\udfff), not Unicode",
        param=loc if where else None,
        hint="send valid Unicode: a surrogate escape must be one of a high-low pair",
    )


def _find(value: Any, path: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The location of the first lone surrogate under ``value``, or None (iterative: bodies nest deep)."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return where
        elif isinstance(item, dict):
            for key, sub in reversed(list(item.items())):
                if _SURROGATE.search(key):
                    return (*where, _printable(key))
                stack.append((sub, (*where, key)))
        elif isinstance(item, list):
            stack.extend((sub, (*where, i)) for i, sub in reversed(list(enumerate(item))))
    return None


def _printable(name: str) -> str:
    """A key that holds a surrogate, with each surrogate shown as ``?`` so the error can be encoded."""
    return _SURROGATE.sub("?", name)


def refuse_empty_prompt(text: str, ids: list[int] | None, *, suffix: str | None = None) -> None:
    """A 400 for a completion prompt with nothing in it (``""``, ``[""]``).

    A runtime has nothing to continue from: llama.cpp's session refused it as a 500 that
    blamed the client, the fake runtime answered. A fill-in-the-middle request (a ``suffix``)
    may start from nothing, and token-id prompts are refused empty by their schema.
    """
    if ids is None and not text and suffix is None:
        raise InvalidRequest(
            "the prompt is empty: there is nothing to complete",
            param="prompt",
            hint="send some text (or token ids) as the prompt",
        )


def refuse_too_many_ids(raw: bytes, data: Any) -> None:
    """A 413 naming the top-level field whose lists hold the most numbers, when the body's lists
    hold more than :data:`MAX_TOKEN_IDS` in all. A number takes at least two bytes of JSON
    (``1,``), so a body under twice the bound needs no walk."""
    if len(raw) < 2 * MAX_TOKEN_IDS or not isinstance(data, dict):
        return
    counts = {key: count_ids(value) for key, value in data.items()}
    check_id_count(max(counts, key=lambda k: counts[k]), sum(counts.values()))


def check_id_count(field: str, count: int) -> None:
    """A 413 naming ``field`` when a request would carry more than :data:`MAX_TOKEN_IDS` token ids."""
    if count > MAX_TOKEN_IDS:
        raise BodyTooLarge(
            f"{field!r} carries {count} token ids; one request may carry at most {MAX_TOKEN_IDS}",
            param=field,
            hint="send fewer token ids (a model reads at most its context), or send text",
        )


def count_ids(value: Any) -> int:
    """How many numbers sit in lists under ``value`` (iterative: bodies nest deep)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            for sub in item:
                if isinstance(sub, (list, dict)):
                    stack.append(sub)
                elif isinstance(sub, int):
                    count += 1
        elif isinstance(item, dict):
            stack.extend(item.values())
    return count
