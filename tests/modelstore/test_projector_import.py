"""`localrun import MODEL.gguf --mmproj FILE` and pairing a registered model by hand.

Real GGUF headers throughout: a tiny llama-arch model (16-wide) and tiny clip projectors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from localrun.cli import main
from localrun.modelstore.projector import PROJECTOR_INFO
from localrun.types import META_PROJECTOR
from tests.hub.repos import make_gguf
from tests.support.projectors import make_projector


@pytest.fixture
def files(tmp_path, _isolated_home):
    model = tmp_path / "seeing-Q4_K_M.gguf"
    model.write_bytes(make_gguf(seed=401))
    proj = tmp_path / "mmproj-seeing-F16.gguf"
    proj.write_bytes(make_projector(vision=True, audio=True, seed=11))
    return model, proj


def _store():
    from localrun.modelstore.store import ModelStore
    from localrun.settings import load_settings

    return ModelStore(load_settings())


def _invoke(*args):
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "200"})


def test_import_with_mmproj_pairs_in_place(files):
    model, proj = files
    result = _invoke("import", str(model), "--mmproj", str(proj), "--name", "seeing")
    assert result.exit_code == 0, result.output
    assert "vision + audio" in result.output
    rec = _store().index.get("seeing")
    assert rec.metadata[META_PROJECTOR] == str(proj) and [e.path for e in rec.files] == [str(model), str(proj)]
    assert rec.metadata[PROJECTOR_INFO]["owned"] is False and not rec.owned
    (row,) = json.loads(_invoke("ls", "--json").output)
    assert row["capabilities"] == ["completion", "vision", "audio"] and row["projector"] == str(proj)
    # importing the same pair again is a no-op; verify hashes both files (trust on first verify)
    assert _invoke("import", str(model), "--mmproj", str(proj), "--name", "seeing").exit_code == 0
    assert _invoke("verify", "seeing").exit_code == 0
    assert all(e.sha256 for e in _store().index.get("seeing").files)
    # rm of an imported model leaves both files where they were
    assert _invoke("rm", "seeing").exit_code == 0 and model.exists() and proj.exists()


def test_pair_a_registered_model_by_name(files, tmp_path):
    model, proj = files
    assert _invoke("import", str(model), "--name", "seeing").exit_code == 0
    assert META_PROJECTOR not in _store().index.get("seeing").metadata
    result = _invoke("import", "seeing", "--mmproj", str(proj))
    assert result.exit_code == 0, result.output
    assert "paired seeing" in result.output
    rec = _store().index.get("seeing")
    assert rec.metadata[META_PROJECTOR] == str(proj) and len(rec.files) == 2
    other = tmp_path / "mmproj-other.gguf"  # a second pairing replaces the first
    other.write_bytes(make_projector(seed=12))
    assert _invoke("import", "seeing", "--mmproj", str(other)).exit_code == 0
    rec = _store().index.get("seeing")
    assert rec.metadata[META_PROJECTOR] == str(other) and [e.path for e in rec.files] == [str(model), str(other)]


@pytest.mark.parametrize(
    "content, message",
    [
        (lambda: make_gguf(seed=402, name="mmproj"), "not a multimodal projector"),
        (lambda: make_projector(n_embd=2560, seed=13), "2560 wide but seeing"),
        (lambda: b"GGUF\x03\x00\x00\x00garbage", "seeing-bad.gguf"),
    ],
)
def test_a_wrong_projector_is_refused_and_nothing_registered(files, tmp_path, content, message):
    model, _ = files
    bad = tmp_path / "seeing-bad.gguf"
    bad.write_bytes(content())
    result = _invoke("import", str(model), "--mmproj", str(bad), "--name", "seeing")
    assert result.exit_code != 0 and message in " ".join(result.output.split())
    assert _store().list() == []


def test_the_projector_alone_is_not_a_model(files):
    _, proj = files
    result = _invoke("import", str(proj))
    assert result.exit_code != 0 and "projector" in result.output and _store().list() == []
