"""The one server-sent-events parser: every OpenAI-compatible stream localrun reads goes through it.

Kept apart from the client so the tests and any other reader of a recorded stream parse
events exactly as a live request does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def iter_sse(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Decode a server-sent-event stream of JSON ``data:`` events until ``[DONE]``."""
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
            continue
        if line or not data:
            continue  # comments (":"), "event:"/"id:" fields, keep-alive blank lines
        payload, data = "\n".join(data), []
        if payload.strip() == "[DONE]":
            return
        yield json.loads(payload)
    if data and "\n".join(data).strip() != "[DONE]":
        yield json.loads("\n".join(data))
