"""The model index: one SQLite file in the data dir that records every registered model.

Why SQLite: the CLI, the server and the TUI may all touch the index at once, from several
processes; SQLite in WAL mode gives atomic transactions, readers that never block the
writer, and a file that a crash (kill -9, power loss mid-write) leaves consistent — the
unfinished transaction is simply not there when the next process opens it.

One connection per call keeps the class thread-safe without locks and leaves no handle
open between calls; opening costs well under a millisecond. Records go in and out as
:class:`localrun.types.ModelRecord`; files and metadata are stored as JSON.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from localrun.errors import ConfigError, InvalidName, ModelExists, ModelNotFound
from localrun.types import ModelRecord

from .names import validate_model_name

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS models (
    name      TEXT PRIMARY KEY,
    format    TEXT NOT NULL,
    path      TEXT NOT NULL,
    source    TEXT NOT NULL,
    owned     INTEGER NOT NULL,
    repo      TEXT,
    revision  TEXT,
    files     TEXT NOT NULL,
    metadata  TEXT NOT NULL,
    added_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS aliases (
    alias   TEXT PRIMARY KEY,
    target  TEXT NOT NULL REFERENCES models(name) ON DELETE CASCADE
);
"""

_COLUMNS = "name, format, path, source, owned, repo, revision, files, metadata, added_at"


def _wal(conn: sqlite3.Connection, *, patience_s: float = 30.0) -> None:
    """Switch to WAL, waiting out another process doing the same.

    Changing the journal mode needs the database to itself, and SQLite answers "database is
    locked" at once there instead of calling the busy handler: two first uses of one index at
    once (two `bundle import`s) made the second one report a damaged index."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class ModelIndex:
    """The registered models, by name. Every method is one short transaction."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._schema_ready = False
        self._schema_lock = threading.Lock()

    # --- plumbing -----------------------------------------------------------------------

    def _damaged(self, exc: sqlite3.Error) -> ConfigError:
        return ConfigError(
            f"model index {self.path} cannot be used: {exc}",
            hint=f"move {self.path} aside and re-import your models (files on disk are untouched)",
        )

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._damaged(exc) from None
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA foreign_keys = ON")
            if not self._schema_ready:
                self._ensure_schema(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise self._damaged(exc) from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        with self._schema_lock:
            if self._schema_ready:
                return
            _wal(conn)
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Statement by statement: executescript() would COMMIT our transaction early.
                for stmt in filter(None, (s.strip() for s in _SCHEMA.split(";"))):
                    conn.execute(stmt)
                row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
                version = row[0] if row else None
                if version is None:
                    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                elif version > SCHEMA_VERSION:
                    raise ConfigError(
                        f"model index {self.path} has schema version {version}, newer than this localrun "
                        f"({SCHEMA_VERSION})",
                        hint="upgrade localrun, or point LOCALRUN_HOME elsewhere",
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            self._schema_ready = True

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        conn = self._open()
        try:
            yield conn
        except sqlite3.Error as exc:
            raise self._damaged(exc) from None
        finally:
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE takes the write lock up front, so check-then-write is atomic."""
        conn = self._open()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._damaged(exc) from None
        finally:
            conn.close()

    @staticmethod
    def _to_row(rec: ModelRecord) -> tuple[Any, ...]:
        d = rec.to_dict()
        return (
            d["name"],
            d["format"],
            d["path"],
            d["source"],
            int(rec.owned),
            rec.repo,
            rec.revision,
            json.dumps(d["files"]),
            json.dumps(d["metadata"], default=str),
            float(rec.added_at),
        )

    def _from_row(self, row: tuple[Any, ...]) -> ModelRecord:
        name, fmt, path, source, owned, repo, revision, files, metadata, added_at = row
        try:
            return ModelRecord.from_dict(
                {
                    "name": name,
                    "format": fmt,
                    "path": path,
                    "source": source,
                    "owned": bool(owned),
                    "repo": repo,
                    "revision": revision,
                    "files": json.loads(files),
                    "metadata": json.loads(metadata),
                    "added_at": added_at,
                }
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(
                f"model index {self.path}: the record for {name!r} is damaged ({exc})",
                hint=f"remove it with `localrun rm {name}` and import it again",
            ) from None

    def _lookup(self, conn: sqlite3.Connection, name: str) -> ModelRecord | None:
        row = conn.execute(f"SELECT {_COLUMNS} FROM models WHERE name = ?", (name,)).fetchone()
        if row is None:
            target = conn.execute("SELECT target FROM aliases WHERE alias = ?", (name,)).fetchone()
            if target is not None:
                row = conn.execute(f"SELECT {_COLUMNS} FROM models WHERE name = ?", (target[0],)).fetchone()
        return self._from_row(row) if row else None

    # --- public API ---------------------------------------------------------------------

    def add(self, record: ModelRecord, *, replace: bool = False) -> ModelRecord:
        """Store ``record`` under its (normalised) name and return what was stored.

        Raises:
            InvalidName: the name is not a valid model name.
            ModelExists: the name (or an alias of that name) is taken and ``replace`` is False.
        """
        import dataclasses

        name = validate_model_name(record.name)
        if name != record.name:
            record = dataclasses.replace(record, name=name)
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM aliases WHERE alias = ?", (name,)).fetchone():
                raise ModelExists(
                    f"{name!r} is already an alias", hint="remove the alias first, or choose another name"
                )
            exists = conn.execute("SELECT 1 FROM models WHERE name = ?", (name,)).fetchone()
            if exists and not replace:
                raise ModelExists(
                    f"a model named {name!r} is already registered",
                    hint="choose another name (--name) or replace it (--replace)",
                )
            if exists:
                # UPDATE rather than DELETE+INSERT so aliases pointing at it survive.
                conn.execute(
                    "UPDATE models SET format=?, path=?, source=?, owned=?, repo=?, revision=?, files=?, "
                    "metadata=?, added_at=? WHERE name=?",
                    (*self._to_row(record)[1:], name),
                )
            else:
                conn.execute(f"INSERT INTO models ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", self._to_row(record))
        logger.info("registered model %s -> %s", name, record.path)
        return record

    def find(self, name: str) -> ModelRecord | None:
        """The record for a name or alias, or None (also for a name that could never be valid)."""
        try:
            key = validate_model_name(name)
        except InvalidName:  # a name that could never be valid is simply not registered
            return None
        with self._read() as conn:
            return self._lookup(conn, key)

    def get(self, name: str) -> ModelRecord:
        """The record for a name or alias. Raises ModelNotFound (or InvalidName)."""
        key = validate_model_name(name)
        with self._read() as conn:
            rec = self._lookup(conn, key)
        if rec is None:
            raise ModelNotFound(f"no model named {key!r}", hint="`localrun ls` lists the registered models")
        return rec

    def list(self) -> list[ModelRecord]:
        """Every record, by name. A damaged row is logged and left out, not fatal for the rest."""
        out = []
        with self._read() as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM models ORDER BY name").fetchall()
        for row in rows:
            try:
                out.append(self._from_row(row))
            except ConfigError as exc:
                logger.warning("%s", exc)
        return out

    def remove(self, name: str) -> ModelRecord:
        """Delete the record (and its aliases) and return it. Files are the store's business."""
        key = validate_model_name(name)
        with self._write() as conn:
            rec = self._lookup(conn, key)
            if rec is None:
                raise ModelNotFound(f"no model named {key!r}", hint="`localrun ls` lists the registered models")
            conn.execute("DELETE FROM models WHERE name = ?", (rec.name,))
        logger.info("unregistered model %s", rec.name)
        return rec

    def set_alias(self, alias: str, target: str) -> None:
        """Make ``alias`` another name for the model ``target`` (replacing an older alias)."""
        alias_key, target_key = validate_model_name(alias), validate_model_name(target)
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM models WHERE name = ?", (alias_key,)).fetchone():
                raise ModelExists(f"{alias_key!r} is already a model name", hint="choose another alias")
            rec = self._lookup(conn, target_key)
            if rec is None:
                raise ModelNotFound(f"no model named {target_key!r}", hint="`localrun ls` lists the registered models")
            conn.execute("INSERT OR REPLACE INTO aliases (alias, target) VALUES (?, ?)", (alias_key, rec.name))

    def remove_alias(self, alias: str) -> None:
        key = validate_model_name(alias)
        with self._write() as conn:
            if conn.execute("DELETE FROM aliases WHERE alias = ?", (key,)).rowcount == 0:
                raise ModelNotFound(f"no alias named {key!r}", hint="`localrun ls` lists models and aliases")

    def aliases(self) -> dict[str, str]:
        """alias -> model name."""
        with self._read() as conn:
            return dict(conn.execute("SELECT alias, target FROM aliases ORDER BY alias").fetchall())
