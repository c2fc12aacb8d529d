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

from localrun.server.errors import InvalidRequest

#: A ``\\u`` escape in the surrogate range (D800–DFFF). Surrogates can reach a parsed string only
#: through such an escape (UTF-8 cannot encode one), so a body without it needs no walk.
_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
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
