"""The SQLite model index: round trips, errors a person can act on, atomicity under crashes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest

from localrun.errors import ConfigError, InvalidName, ModelExists, ModelNotFound
from localrun.modelstore.index import SCHEMA_VERSION, ModelIndex
from localrun.settings import load_settings
from localrun.types import FileEntry, Format, ModelRecord, Source


def _rec(name: str, **kw) -> ModelRecord:
    base = dict(
        name=name,
        format=Format.GGUF,
        path=f"/models/{name}.gguf",
        files=(FileEntry(f"/models/{name}.gguf", 1234, "ab" * 32),),
        source=Source.IMPORTED,
        metadata={"architecture": "llama", "n_params": 7, "nested": {"a": [1, 2]}},
        added_at=1700000000.5,
    )
    base.update(kw)
    return ModelRecord(**base)


@pytest.fixture
def index(tmp_path):
    return ModelIndex(tmp_path / "data" / "index.sqlite3")


def test_round_trip_every_field(index):
    rec = _rec("m1", owned=True, repo="org/repo", revision="abc123", source=Source.HUB, format=Format.MLX)
    assert index.add(rec) == rec
    assert index.get("m1") == rec
    assert index.find("M1") == rec  # names are case-insensitive
    assert index.list() == [rec]


def test_add_normalises_the_name(index):
    stored = index.add(_rec("Org/Model:Q4"))
    assert stored.name == "org/model:q4" and index.get("ORG/MODEL:Q4") == stored


def test_duplicate_needs_replace(index):
    index.add(_rec("m"))
    with pytest.raises(ModelExists) as ei:
        index.add(_rec("m", path="/other.gguf"))
    assert "'m'" in ei.value.message and ei.value.hint
    replaced = index.add(_rec("m", path="/other.gguf"), replace=True)
    assert index.get("m").path == "/other.gguf" == replaced.path
    assert len(index.list()) == 1


def test_missing_model_names_it_and_hints_ls(index):
    with pytest.raises(ModelNotFound) as ei:
        index.get("nope")
    assert "'nope'" in ei.value.message and "localrun ls" in ei.value.hint
    assert index.find("nope") is None
    assert index.find("../etc") is None  # invalid names are just not there
    with pytest.raises(InvalidName):
        index.get("../etc")
    with pytest.raises(ModelNotFound):
        index.remove("nope")


def test_list_sorted_and_remove(index):
    for n in ("c", "a", "b"):
        index.add(_rec(n))
    assert [r.name for r in index.list()] == ["a", "b", "c"]
    assert index.remove("b").name == "b"
    assert [r.name for r in index.list()] == ["a", "c"]


def test_aliases(index):
    index.add(_rec("gemma3-270m"))
    index.set_alias("default", "gemma3-270m")
    assert index.get("default").name == "gemma3-270m"
    assert index.aliases() == {"default": "gemma3-270m"}
    with pytest.raises(ModelExists):
        index.add(_rec("default"))
    with pytest.raises(ModelExists):
        index.set_alias("gemma3-270m", "gemma3-270m")
    with pytest.raises(ModelNotFound):
        index.set_alias("x", "missing")
    index.add(_rec("gemma3-270m", path="/new.gguf"), replace=True)
    assert index.get("default").path == "/new.gguf"  # replace keeps aliases
    index.remove("gemma3-270m")
    assert index.aliases() == {} and index.find("default") is None
    with pytest.raises(ModelNotFound):
        index.remove_alias("default")


def test_uses_settings_index_path_and_wal(tmp_path):
    settings = load_settings()
    idx = ModelIndex(settings.index_path)
    idx.add(_rec("m"))
    assert settings.index_path.is_file()
    with sqlite3.connect(settings.index_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        row = conn.execute("SELECT metadata FROM models").fetchone()
    assert json.loads(row[0])["nested"] == {"a": [1, 2]}


def test_newer_schema_refused(tmp_path):
    path = tmp_path / "index.sqlite3"
    ModelIndex(path).list()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(ConfigError, match="newer"):
        ModelIndex(path).list()


def test_garbage_file_is_a_config_error_naming_it(tmp_path):
    path = tmp_path / "index.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConfigError) as ei:
        ModelIndex(path).list()
    assert str(path) in ei.value.message and ei.value.hint


def test_damaged_row_is_skipped_in_list_and_named_in_get(index):
    index.add(_rec("good"))
    index.add(_rec("bad"))
    with sqlite3.connect(index.path) as conn:
        conn.execute("UPDATE models SET files = 'not json' WHERE name = 'bad'")
    assert [r.name for r in index.list()] == ["good"]
    with pytest.raises(ConfigError, match="'bad'"):
        index.get("bad")


def test_concurrent_writers_from_threads(index):
    errors = []

    def worker(k: int) -> None:
        try:
            for i in range(10):
                index.add(_rec(f"t{k}-{i}"))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(index.list()) == 40


def test_kill_mid_transaction_leaves_index_usable(index):
    index.add(_rec("before"))
    # A child opens a write transaction, inserts rows, and dies without committing.
    code = textwrap.dedent(f"""
        import os, sqlite3
        conn = sqlite3.connect({str(index.path)!r}, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        for i in range(100):
            conn.execute("INSERT INTO models (name, format, path, source, owned, files, metadata, added_at) "
                         "VALUES (?, 'gguf', '/x', 'imported', 0, '[]', '{{}}', 0)", (f"ghost{{i}}",))
        os.kill(os.getpid(), 9)
    """)
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode != 0
    assert [r.name for r in index.list()] == ["before"]
    index.add(_rec("after"))  # and the write lock was released
    assert [r.name for r in index.list()] == ["after", "before"]
