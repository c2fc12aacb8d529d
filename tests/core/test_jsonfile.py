"""localrun.jsonfile: the one reader for small JSON objects on disk (configs, manifests, journals)."""

from __future__ import annotations

import os

import pytest

from localrun.jsonfile import NotAJsonObject, read_json_object


def test_an_object_is_returned(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "n": 1}')
    assert read_json_object(path) == {"model_type": "llama", "n": 1}


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"[1, 2]", "holds a JSON list, not an object"),
        (b"{not json", "is not valid JSON"),
        (b"\xff\xfe{}", "is not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "is not valid JSON"),  # nesting past the stack
    ],
)
def test_what_is_not_an_object_is_named(tmp_path, content, why):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(NotAJsonObject, match=why) as err:
        read_json_object(path)
    assert str(path) in str(err.value) and err.value.path == path


def test_the_size_is_bounded_before_reading(tmp_path):
    path = tmp_path / "big.json"
    path.write_text('{"a": "' + "x" * 100 + '"}')
    with pytest.raises(NotAJsonObject, match="larger than the 64 bytes"):
        read_json_object(path, max_bytes=64)
    assert read_json_object(path, max_bytes=200)["a"] == "x" * 100


def test_missing_folders_and_fifos_are_refused_without_blocking(tmp_path):
    with pytest.raises(NotAJsonObject, match="cannot be read"):
        read_json_object(tmp_path / "absent.json")
    with pytest.raises(NotAJsonObject, match="not a regular file"):
        read_json_object(tmp_path)
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(NotAJsonObject, match="not a regular file"):
        read_json_object(fifo)  # opened non-blocking: a FIFO with no writer does not hang the reader


def test_a_symlink_is_refused_only_when_asked(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert read_json_object(link) == {}
    with pytest.raises(NotAJsonObject, match="cannot be read"):
        read_json_object(link, follow_symlinks=False)
