"""Ollama's names and digests for store registrations (modelstore/identity.py) and the store's
``NAME:latest`` lookup."""

from __future__ import annotations

import dataclasses

from localrun.modelstore.identity import has_tag, other_latest, registration_digest, tagged, without_latest
from localrun.modelstore.store import ModelStore
from localrun.settings import Settings


def test_latest_spellings():
    assert tagged("gemma") == "gemma:latest" and tagged("org/m:q4") == "org/m:q4" and tagged("org/m") == "org/m:latest"
    assert without_latest("gemma:LATEST") == "gemma" and without_latest("gemma:q4") is None
    assert without_latest(":latest") is None
    assert other_latest("a") == "a:latest" and other_latest("a:latest") == "a" and other_latest("a:q8") == "a:q8"
    assert has_tag("org/m:q4") and not has_tag("org/m")


def test_store_resolves_either_spelling(tiny_gguf):
    store = ModelStore(Settings())
    store.import_path(tiny_gguf, name="tiny")
    store.import_path(tiny_gguf, name="other:latest")
    assert store.resolve("tiny:latest").name == "tiny"
    assert store.resolve("other").name == "other:latest"


def test_digest_is_hex_and_moves_with_overrides_and_content(tiny_gguf):
    store = ModelStore(Settings())
    record = store.import_path(tiny_gguf, name="tiny")
    plain = registration_digest(record)
    assert len(plain) == 64 and int(plain, 16) >= 0
    assert registration_digest(dataclasses.replace(record, name="renamed")) == plain  # the name is not the model
    pooled = dataclasses.replace(record, metadata={**record.metadata, "localrun.pooling": "mean"})
    assert registration_digest(pooled) != plain
    assert registration_digest(record, {"config.pooling": "cls"}) != plain
    assert registration_digest(store.verify("tiny")) != plain  # now the file's sha256 stands for it
