"""The sha256 promise holds when a file's mtime is put back: ``touch -r``, ``cp -p`` and
``rsync -t`` keep size and mtime, and before, both the mirror's verifier and the store's check
before a load trusted those two alone (a changed byte was served whole under the old ETag). Now a
file is trusted unread only while its change time (ctime) is the recorded one too. A file with
no recorded sha256 is held to the first hash the mirror took of it."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from localrun.errors import VerificationFailed
from localrun.modelstore.hub_catalog import MirrorFile, Verifier
from localrun.modelstore.store import ModelStore


def _flip_keeping_mtime(path: Path) -> None:
    st = os.stat(path)
    time.sleep(0.01)  # a ctime the flip can differ by, on coarse clocks
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -r: size and mtime as before


def _file(tmp_path: Path, sha256: bool = True) -> tuple[Path, MirrorFile]:
    path = tmp_path / "model.gguf"
    path.write_bytes(os.urandom(4096))
    st = os.stat(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if sha256 else None
    return path, MirrorFile("model.gguf", st.st_size, str(path), digest, None, st.st_mtime_ns, st.st_ctime_ns)


def test_a_byte_changed_with_its_mtime_put_back_is_rehashed_and_refused(tmp_path):
    path, f = _file(tmp_path)
    assert Verifier().good_key(f) is not None  # as recorded: trusted without a read
    _flip_keeping_mtime(path)
    verifier = Verifier()  # a fresh mirror, as after a restart
    assert verifier.good_key(f) is None
    with pytest.raises(VerificationFailed, match="model.gguf no longer matches"):
        verifier.verify(f)


def test_a_file_without_a_recorded_hash_is_held_to_the_first_one_taken(tmp_path):
    path, f = _file(tmp_path, sha256=False)
    verifier = Verifier()
    verifier.verify(f)
    first = verifier.sha256(f)
    _flip_keeping_mtime(path)
    with pytest.raises(VerificationFailed, match="changed since the mirror first served it"):
        verifier.verify(f)
    assert verifier.sha256(f) == first  # never published as the model's


def test_the_store_rehashes_before_a_load_when_only_the_mtime_was_put_back(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALRUN_HOME", str(tmp_path / "home"))
    from localrun.settings import load_settings
    from tests.factories import write_tiny_llama_gguf

    model = write_tiny_llama_gguf(tmp_path / "m.gguf")
    store = ModelStore(load_settings())
    store.import_path(model, name="m")
    store.verify("m")
    store.resolve("m")
    _flip_keeping_mtime(Path(model))
    with pytest.raises(VerificationFailed, match="no longer matches"):
        store.resolve("m")


@pytest.mark.parametrize("header", ["bytes=" + "9" * 4300 + "-", "bytes=0-" + "9" * 4300, "bytes=-" + "9" * 5000])
def test_a_range_of_thousands_of_digits_is_a_416_not_a_500(header):
    from localrun.server.mirror.files import RangeNotSatisfiable, parse_range

    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, 1000)
    assert parse_range("bytes=0-" + "9" * 19, 1000) == (0, 1000)  # a large but parseable end is the file's end
