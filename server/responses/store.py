"""Stored responses for ``previous_response_id``: SQLite in the data dir, bounded in count and age.

A response created with ``store`` true (the default, as in OpenAI) is kept with the input
items its request sent, so a later request naming it continues the conversation: the
chain is walked back to its start and each link's input and output items are replayed
before the new input (OpenAI's rule; ``instructions`` are not carried over). ``store:
false`` keeps nothing. The table holds at most ``max_stored`` responses and none older
than ``max_age_s``; the oldest go first. A chain whose link has gone is an error naming
the missing id, never a silently shorter conversation.

SQLite calls are short and run on a worker thread (``asyncio.to_thread``); each call
opens its own connection, so threads never share one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localrun.errors import LocalrunError
from localrun.server.errors import InvalidRequest

log = logging.getLogger(__name__)

MAX_STORED = 1000
"""Responses kept at most; the oldest are deleted first."""
MAX_AGE_S = 30 * 24 * 3600.0
"""Age after which a stored response is gone (OpenAI keeps them 30 days)."""
MAX_CHAIN = 256
"""Links a ``previous_response_id`` chain may have."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    previous_id TEXT,
    input TEXT NOT NULL,
    response TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses(created_at);
"""


class ResponseNotFound(LocalrunError):
    http_status = 404
    code = "not_found"


class PreviousNotFound(LocalrunError):
    http_status = 404
    code = "previous_response_not_found"


class ResponseStore:
    def __init__(self, path: Path, *, max_stored: int = MAX_STORED, max_age_s: float = MAX_AGE_S):
        self.path = Path(path)
        self.max_stored, self.max_age_s = max_stored, max_age_s
        self._lock = threading.Lock()
        self._ready = False

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection for one call: committed when the block succeeds, closed either way."""
        if not self._ready:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=10)
        try:
            if not self._ready:
                conn.executescript(_SCHEMA)
                self._ready = True
            with conn:
                yield conn
        finally:
            conn.close()

    def put(self, rid: str, previous_id: str | None, input_items: list[Any], response: dict[str, Any]) -> None:
        """Keep one response, then drop what is past the age limit or over the cap."""
        now = time.time()
        with self._lock, self._connect() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                (
                    rid,
                    now,
                    previous_id,
                    json.dumps(input_items, ensure_ascii=False),
                    json.dumps(response, ensure_ascii=False),
                ),
            )
            conn.execute("DELETE FROM responses WHERE created_at < ?", (now - self.max_age_s,))
            conn.execute(
                "DELETE FROM responses WHERE id NOT IN (SELECT id FROM responses ORDER BY created_at DESC LIMIT ?)",
                (self.max_stored,),
            )

    def _row(self, conn: sqlite3.Connection, rid: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = conn.execute(
            "SELECT previous_id, input, response FROM responses WHERE id = ? AND created_at >= ?",
            (rid, time.time() - self.max_age_s),
        ).fetchone()
        return row

    def get(self, rid: str) -> dict[str, Any]:
        with self._connect() as conn:
            row = self._row(conn, rid)
        if row is None:
            raise ResponseNotFound(
                f"no stored response with id {rid[:200]!r}",
                hint="responses are kept only when created with store true, and for a limited time",
            )
        response: dict[str, Any] = json.loads(row[2])
        return response

    def input_items(self, rid: str) -> list[Any]:
        with self._connect() as conn:
            row = self._row(conn, rid)
        if row is None:
            raise ResponseNotFound(f"no stored response with id {rid[:200]!r}")
        items: list[Any] = json.loads(row[1])
        return items

    def delete(self, rid: str) -> bool:
        with self._lock, self._connect() as conn:
            return conn.execute("DELETE FROM responses WHERE id = ?", (rid,)).rowcount > 0

    def history(self, rid: str) -> list[Any]:
        """The items a request continuing ``rid`` starts from: each link's input then output, oldest first."""
        links: list[tuple[list[Any], list[Any]]] = []
        seen: set[str] = set()
        current: str | None = rid
        with self._connect() as conn:
            while current is not None:
                if current in seen or len(links) >= MAX_CHAIN:
                    raise InvalidRequest(
                        f"previous_response_id {rid!r} leads to a chain longer than {MAX_CHAIN} responses",
                        hint="send the conversation in 'input' instead",
                        param="previous_response_id",
                    )
                seen.add(current)
                row = self._row(conn, current)
                if row is None:
                    which = "" if current == rid else f" (an earlier link of {rid!r})"
                    raise PreviousNotFound(
                        f"previous response with id {current[:200]!r}{which} not found",
                        hint="it was created with store false, deleted, or is past the age limit; "
                        "send the conversation in 'input'",
                        param="previous_response_id",
                    )
                previous, items, response = row
                links.append((json.loads(items), json.loads(response).get("output") or []))
                current = previous
        out: list[Any] = []
        for items, output in reversed(links):
            out.extend(items)
            out.extend(output)
        return out
