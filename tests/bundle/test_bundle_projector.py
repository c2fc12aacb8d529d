"""A bundle carries a model and its projector as one: the lock names the projector, the
importer checks its header like the model's and records the pair at its new place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun.errors import InvalidModelFile
from localrun.modelstore.bundle.export import export_bundle
from localrun.modelstore.bundle.importer import import_bundle, verify_bundle
from localrun.modelstore.bundle.lock import LOCK_NAME, BundleError, parse_lock
from localrun.modelstore.capabilities import media as capabilities
from localrun.modelstore.projector import PROJECTOR_INFO
from localrun.types import AUDIO, META_PROJECTOR, VISION
from tests.hub import repos
from tests.support.projectors import make_projector

REPO = "visionorg/Bundled-GGUF"


@pytest.mark.parametrize("form", ["dir", "tar"])
def test_pulled_pair_round_trip(form, fake_hub, source, target, tmp_path):
    from localrun.modelstore.pull import pull

    fake_hub.add_repo(
        REPO,
        {
            "Bundled-Q4_K_M.gguf": repos.make_gguf(seed=601),
            "mmproj-Bundled-F16.gguf": make_projector(seed=31),
            "mmproj-Bundled-Q8_0.gguf": make_projector(seed=32, file_type=7),
        },
    )
    rec = pull(source.store(), REPO)
    out = tmp_path / ("b.tar" if form == "tar" else "b")
    m = export_bundle(source.store(), [rec.name], out).lock.models[0]
    assert m.projector == "mmproj-Bundled-Q8_0.gguf" and not m.synthetic
    assert {f.path for f in m.files} == {"Bundled-Q4_K_M.gguf", "mmproj-Bundled-Q8_0.gguf"}
    if form == "dir":
        assert json.loads((out / LOCK_NAME).read_text())["models"][0]["projector"] == "mmproj-Bundled-Q8_0.gguf"
    assert verify_bundle(out).models[0].projector == m.projector

    store = target.store()
    import_bundle(store, out)
    got = store.resolve(rec.name)
    snap = target.hf_cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / m.commit
    assert got.metadata[META_PROJECTOR] == str(snap / "mmproj-Bundled-Q8_0.gguf")  # rewritten to the new place
    assert [e.path for e in got.files] == [str(snap / "Bundled-Q4_K_M.gguf"), str(snap / "mmproj-Bundled-Q8_0.gguf")]
    assert got.files[1].sha256 == fake_hub.file(REPO, "mmproj-Bundled-Q8_0.gguf").sha256
    assert got.metadata[PROJECTOR_INFO]["owned"] is True and capabilities(got) == (VISION,)
    store.verify(rec.name)
    store.remove(rec.name)  # the bundle's files are localrun's: both go
    assert not (snap / "mmproj-Bundled-Q8_0.gguf").exists() and not (snap / "Bundled-Q4_K_M.gguf").exists()


def test_hand_paired_local_model_round_trip(source, target, tmp_path):
    model = tmp_path / "omni-Q4_K_M.gguf"
    model.write_bytes(repos.make_gguf(seed=602))
    proj = tmp_path / "elsewhere" / "mmproj-omni.gguf"
    proj.parent.mkdir()
    proj.write_bytes(make_projector(vision=True, audio=True, seed=33))
    source.store().import_path(model, name="omni", mmproj=proj)
    m = export_bundle(source.store(), ["omni"], tmp_path / "b").lock.models[0]
    assert m.synthetic and m.projector == "mmproj-omni.gguf" and m.primary == "omni-Q4_K_M.gguf"
    store = target.store()
    import_bundle(store, tmp_path / "b")
    got = store.resolve("omni")
    assert Path(got.metadata[META_PROJECTOR]).parent == Path(got.path).parent  # one snapshot now
    assert capabilities(got) == (VISION, AUDIO) and got.metadata[PROJECTOR_INFO]["owned"] is True


def _lock_with(tmp_path, source, **change) -> bytes:
    model = tmp_path / "m-Q4_K_M.gguf"
    model.write_bytes(repos.make_gguf(seed=603))
    proj = tmp_path / "mmproj-m.gguf"
    proj.write_bytes(make_projector(seed=34))
    source.store().import_path(model, name="m", mmproj=proj)
    export_bundle(source.store(), ["m"], tmp_path / "b")
    doc = json.loads((tmp_path / "b" / LOCK_NAME).read_text())
    doc["models"][0].update(change)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("projector", ["missing.gguf", "m-Q4_K_M.gguf", 7])
def test_a_lock_naming_a_projector_outside_the_model_is_refused(source, tmp_path, projector):
    with pytest.raises(BundleError, match="projector"):
        parse_lock(_lock_with(tmp_path, source, projector=projector))


def test_a_bundled_projector_that_is_not_one_is_refused_and_nothing_registered(source, target, tmp_path):
    """The lock's hashes match, but the file it calls the projector is a llama model: the
    importer's header check refuses it and rolls the import back."""
    model = tmp_path / "m-Q4_K_M.gguf"
    model.write_bytes(repos.make_gguf(seed=604))
    other = tmp_path / "m-Q8_0.gguf"
    other.write_bytes(repos.make_gguf(quant="Q8_0", seed=605))
    proj = tmp_path / "mmproj-m.gguf"
    proj.write_bytes(make_projector(seed=35))
    store = source.store()
    store.import_path(model, name="m", mmproj=proj)
    rec = store.index.get("m")
    # a record whose projector entry is really a second model (as a hand-edited index would say)
    import dataclasses

    from localrun.types import FileEntry

    bad = dataclasses.replace(
        rec,
        files=(rec.files[0], FileEntry(str(other), other.stat().st_size)),
        metadata={**rec.metadata, META_PROJECTOR: str(other)},
    )
    store.index.add(bad, replace=True)
    export_bundle(store, ["m"], tmp_path / "b")
    target_store = target.store()
    with pytest.raises(InvalidModelFile, match="not a multimodal projector"):
        import_bundle(target_store, tmp_path / "b")
    assert target_store.list() == [] and not list(target.hf_cache.glob("models--*/snapshots/*/*"))
