"""A file that is not a GGUF is called what it is (a PNG given as --mmproj is a PNG image, not a
"truncated download"), with a hint that fits; a broken GGUF keeps the download hint (issue 33)."""

from __future__ import annotations

import pytest

from localrun.errors import InvalidModelFile
from localrun.modelstore.store import ModelStore
from localrun.settings import load_settings
from tests.factories import write_tiny_llama_gguf
from tests.server.media_samples import image, png, wav

OTHER_FILES = {
    "png": (png(), "a PNG image"),
    "jpeg": (image("JPEG"), "a JPEG image"),
    "webp": (image("WEBP"), "a WebP image"),
    "wav": (wav(), "WAV audio"),
    "html": (b"<!DOCTYPE html><html>Sign in</html>" * 4, "HTML"),
    "lfs pointer": (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n", "Git LFS pointer"),
    "safetensors": ((20).to_bytes(8, "little") + b'{"a": {"dtype": 1}}' + bytes(16), "safetensors"),
}


@pytest.mark.parametrize("kind", list(OTHER_FILES))
def test_a_picture_as_a_projector_is_called_a_picture(tmp_path, kind):
    data, said = OTHER_FILES[kind]
    model = write_tiny_llama_gguf(tmp_path / "m.gguf")
    other = tmp_path / f"mmproj.{kind}"
    other.write_bytes(data)
    store = ModelStore(load_settings())
    with pytest.raises(InvalidModelFile) as err:
        store.import_path(model, name="m", mmproj=other)
    assert f"not a GGUF file: it is {said}" in err.value.message or said in err.value.message
    assert "truncated download" not in str(err.value)
    assert store.list() == []


def test_a_truncated_gguf_still_says_download_it_again(tmp_path):
    model = write_tiny_llama_gguf(tmp_path / "m.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model.read_bytes()[:200])
    with pytest.raises(InvalidModelFile, match="truncated") as err:
        ModelStore(load_settings()).import_path(cut)
    assert "download it again" in (err.value.hint or "")
