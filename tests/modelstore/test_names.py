"""Model names and untrusted relative file names: every hostile one refused, nothing created."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from localrun.errors import InvalidName
from localrun.modelstore.names import (
    ModelName,
    model_name_from_filename,
    safe_join,
    safe_relpath,
    shard_name,
    split_shard_name,
    validate_model_name,
)

HOSTILE_RELPATHS = [
    "",
    ".",
    "..",
    "../x",
    "../../etc/passwd",
    "a/../../b",
    "a/..",
    "a/./b",
    "./a",
    "/abs",
    "/etc/passwd",
    "//server/share/x",
    "a//b",
    "a/",
    "C:\\x",
    "C:x",
    "c:/windows/system32",
    "D:",
    "\\\\host\\share\\x",
    "\\\\?\\C:\\x",
    "\\\\.\\PhysicalDrive0",
    "a\\..\\..\\b",
    "..\\x",
    "x\\y",
    "a\x00b",
    "model.gguf\x00.txt",
    "a\nb",
    "a\rb",
    "a\tb",
    "\x7f",
    "file.gguf:stream",
    "a/b:c",
    "CON",
    "con.txt",
    "dir/NUL.gguf",
    "LPT1",
    "com9.json",
    "aux",
    ".. ",
    "x.",
    "dir./x",
    "a ",
    "~/x",
    "~root/.ssh/id_rsa",
    "a\u202eb",  # right-to-left override
    "a\u200bb",  # zero-width space
    "\ufeffbom",
    "\uff0e\uff0e/x",  # fullwidth dots fold to ".." under NFKC
    "a\u2215b\uff0f..",  # fullwidth solidus folds to "/"
    "x" * 256,
    "/".join(["d"] * 40),
    "a" * 1025,
    "\ud800",  # lone surrogate
]


@pytest.mark.parametrize("name", HOSTILE_RELPATHS, ids=[repr(n)[:40] for n in HOSTILE_RELPATHS])
def test_hostile_relpaths_refused(name):
    with pytest.raises(InvalidName):
        safe_relpath(name)


def test_corpus_is_big_enough():
    assert len(HOSTILE_RELPATHS) >= 40


@pytest.mark.parametrize(
    "name",
    [
        "model.gguf",
        "Q4_K_M/model-00001-of-00002.gguf",
        "config.json",
        "a b/c-d_e.f",
        "日本語/モデル.gguf",
        ".gitattributes",
        "x..y",
        "sub/dir/tokenizer.model",
    ],
)
def test_ordinary_relpaths_accepted(name):
    p = safe_relpath(name)
    assert isinstance(p, PurePosixPath) and str(p) == name and not p.is_absolute()


@pytest.mark.parametrize("value", [None, 3, b"model.gguf", ["a"]])
def test_non_text_refused(value):
    with pytest.raises(InvalidName):
        safe_relpath(value)
    with pytest.raises(InvalidName):
        validate_model_name(value)


def test_safe_join_stays_inside_and_refuses_planted_symlinks(tmp_path):
    store = tmp_path / "store"
    (store / "sub").mkdir(parents=True)
    evil = tmp_path / "store-evil"
    evil.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    assert safe_join(store, "sub/model.gguf") == store.resolve() / "sub" / "model.gguf"
    os.symlink(outside, store / "link")
    os.symlink(evil, store / "evil")
    os.symlink("../../store-evil/x", store / "sub" / "rel")  # sibling prefix, relative link
    for name in ("link/x.gguf", "evil/x", "sub/rel", "link"):
        with pytest.raises(InvalidName, match="outside"):
            safe_join(store, name)
    for name in HOSTILE_RELPATHS:
        with pytest.raises(InvalidName):
            safe_join(store, name)
    # nothing was created anywhere by any of it
    assert sorted(p.name for p in store.rglob("*")) == ["evil", "link", "rel", "sub"]
    assert list(outside.iterdir()) == [] and list(evil.iterdir()) == []


def test_safe_join_allows_symlinks_that_stay_inside(tmp_path):
    store = tmp_path / "store"
    (store / "blobs").mkdir(parents=True)
    (store / "snap").mkdir()
    os.symlink("../blobs/abc", store / "snap" / "model.gguf")  # the HF cache layout
    assert safe_join(store, "snap/model.gguf").name == "model.gguf"


@pytest.mark.parametrize(
    "name,expected",
    [
        ("gemma3-270m", "gemma3-270m"),
        ("Gemma3-270M", "gemma3-270m"),
        ("  llama3.2:1b  ", "llama3.2:1b"),
        ("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", "bartowski/llama-3.2-1b-instruct-gguf:q4_k_m"),
        ("a", "a"),
        ("x" * 128, "x" * 128),
    ],
)
def test_valid_model_names(name, expected):
    assert validate_model_name(name) == expected
    assert ModelName(name) == expected and isinstance(ModelName(name), str)


def is_valid_model_name(name: object) -> bool:
    """Only these tests ask yes/no; the package raises InvalidName, which says why."""
    try:
        validate_model_name(name)
    except InvalidName:
        return False
    return True


@pytest.mark.parametrize(
    "name",
    [
        "",
        " ",
        "-x",
        ".x",
        "_x",
        "x" * 129,
        "a/b/c",
        "/a",
        "a/",
        "a//b",
        "a/../b",
        "..",
        "a..b",
        "a.",
        "org./x",
        "a:b:c",
        "a:",
        ":a",
        "a b",
        "a\x00",
        "a\\b",
        "ü",
        "a/b:",
        "C:\\x",
        "a;rm -rf",
        "a\nb",
    ],
)
def test_invalid_model_names(name):
    with pytest.raises(InvalidName):
        validate_model_name(name)
    assert not is_valid_model_name(name)


@pytest.mark.parametrize(
    "filename,expected",
    [
        ("Gemma-3-270M-Q4_K_M.gguf", "gemma-3-270m-q4_k_m"),
        ("Qwen3-8B-Q4_K_M-00001-of-00003.gguf", "qwen3-8b-q4_k_m"),
        ("model (copy).gguf", "model-copy"),
        ("..hidden..gguf", "hidden"),
        ("Modèle.gguf", "modele"),
        ("日本語.gguf", "model"),
        ("x" * 300 + ".gguf", "x" * 128),
    ],
)
def test_model_name_from_filename(filename, expected):
    assert model_name_from_filename(filename) == expected
    assert is_valid_model_name(model_name_from_filename(filename))


def test_shard_names_round_trip():
    assert split_shard_name(shard_name("Qwen3-Q4_K_M", 2, 3)) == ("Qwen3-Q4_K_M", 2, 3)
    assert split_shard_name("model.gguf") is None
    assert split_shard_name("m-00004-of-00003.gguf") is None
    assert split_shard_name("m-00000-of-00003.gguf") is None
    assert Path(shard_name("m", 1, 12)).name == "m-00001-of-00012.gguf"
