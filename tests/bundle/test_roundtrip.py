"""export -> verify -> import, folder and tar, for local, hub-pulled, MLX and the real Gemma model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localrun.errors import ModelExists
from localrun.modelstore.bundle.export import export_bundle
from localrun.modelstore.bundle.importer import import_bundle, verify_bundle
from localrun.modelstore.bundle.lock import LOCK_NAME
from localrun.modelstore.gitids import lfs_git_oid
from tests.bundle.conftest import sha256_file
from tests.conftest import needs_llama
from tests.hub.fakehub import git_blob_oid
from tests.hub.repos import GGUF_REPO, MLX_REPO

LOCALRUN = [str(Path(sys.executable).with_name("localrun"))]


@pytest.mark.parametrize("form", ["dir", "tar"])
def test_local_model_round_trip(form, source, target, tiny_model, tiny_gguf, tmp_path):
    out = tmp_path / ("b.tar" if form == "tar" else "b")
    result = export_bundle(source.store(), ["tiny"], out)
    lock = json.loads((out / LOCK_NAME).read_text()) if form == "dir" else None
    m = result.lock.models[0]
    assert (m.repo, m.synthetic, m.revision, m.format.value) == ("local/tiny", True, "main", "gguf")
    f = m.files[0]
    assert (f.path, f.size, f.sha256, f.lfs) == (tiny_gguf.name, tiny_gguf.stat().st_size, sha256_file(tiny_gguf), True)
    assert f.git_oid == lfs_git_oid(f.sha256, f.size)
    if lock is not None:
        assert lock["schema_version"] == 1 and lock["models"][0]["architecture"] == "llama"
        assert (
            os.readlink(out / "hub/models--local--tiny/snapshots" / m.commit / tiny_gguf.name)
            == f"../../blobs/{f.sha256}"
        )
        assert (out / "hub/models--local--tiny/refs/main").read_text() == m.commit
    assert verify_bundle(out).models[0].name == "tiny"

    store = target.store()
    res = import_bundle(store, out)
    rec = store.resolve("tiny")
    assert rec.source.value == "bundle" and rec.owned and rec.repo == "local/tiny" and rec.revision == m.commit
    blob = target.hf_cache / "models--local--tiny" / "blobs" / f.sha256
    assert (
        sha256_file(blob) == f.sha256
        and Path(rec.path) == target.hf_cache / "models--local--tiny/snapshots" / m.commit / tiny_gguf.name
    )
    assert rec.files[0].sha256 == f.sha256 and rec.metadata["architecture"] == "llama"
    if form == "dir":  # same filesystem, exported here: a hard link, nothing re-hashed
        assert (res.linked, res.bytes_hashed) == (1, 0) and os.path.samefile(blob, out / m.blob_relpath(f))
    else:
        assert (res.copied, res.bytes_hashed) == (1, f.size)
    assert store.verify("tiny").files[0].sha256 == f.sha256


def test_exporting_twice_gives_the_same_lock(source, tiny_model, tmp_path):
    a = export_bundle(source.store(), ["tiny"], tmp_path / "a").lock
    b = export_bundle(source.store(), ["tiny"], tmp_path / "b.tar").lock
    assert a.models == b.models


def test_import_is_idempotent_and_rerun_reuses(source, target, tiny_model, tmp_path):
    export_bundle(source.store(), ["tiny"], tmp_path / "b")
    store = target.store()
    import_bundle(store, tmp_path / "b")
    first = target.state()
    again = import_bundle(store, tmp_path / "b")
    assert (again.reused, again.linked, again.copied, again.bytes_hashed) == (1, 0, 0, 0)
    assert target.state() == first and len(store.list()) == 1


def test_hub_model_keeps_repo_commit_and_etags(fake_hub, source, target, tmp_path):
    from localrun.modelstore.pull import pull

    rec = pull(source.store(), GGUF_REPO)
    commit = rec.revision
    lock = export_bundle(source.store(), [rec.name], tmp_path / "b").lock
    m = lock.models[0]
    assert (m.repo, m.synthetic, m.commit, m.revision, m.quant) == (GGUF_REPO, False, commit, "main", "Q4_K_M")
    hub_file = fake_hub.file(GGUF_REPO, m.primary)
    f = next(x for x in m.files if x.path == m.primary)
    # The hub's tree oid of an LFS file is the git sha1 of its pointer text (the fake hub
    # simplifies it to the sha1 of the bytes, so compare with the pointer's sha1 directly).
    assert (f.sha256, f.git_oid, f.lfs) == (hub_file.sha256, lfs_git_oid(hub_file.sha256, len(hub_file.data)), True)
    assert f.origin == f"{fake_hub.url}/{GGUF_REPO}/resolve/{commit}/{m.primary}"

    store = target.store()
    import_bundle(store, tmp_path / "b")
    got = store.resolve(rec.name)
    assert (got.repo, got.revision) == (GGUF_REPO, commit)
    folder = target.hf_cache / ("models--" + GGUF_REPO.replace("/", "--"))
    assert (folder / "refs/main").read_text() == commit
    assert (folder / "blobs" / hub_file.etag).is_file()  # the name huggingface_hub and llama.cpp would use


def test_small_git_files_carry_their_git_blob_oid(fake_hub, source, target, tmp_path):
    from localrun.modelstore.pull import pull

    rec = pull(source.store(), MLX_REPO)
    lock = export_bundle(source.store(), [rec.name], tmp_path / "b.tar").lock
    m = lock.models[0]
    assert m.format.value == "mlx" and m.primary == ""
    config = next(f for f in m.files if f.path == "config.json")
    assert not config.lfs and config.git_oid == git_blob_oid(fake_hub.file(MLX_REPO, "config.json").data)
    store = target.store()
    import_bundle(store, tmp_path / "b.tar")
    got = store.resolve(rec.name)
    assert got.format.value == "mlx" and (Path(got.path) / "config.json").is_file()
    assert (target.hf_cache / ("models--" + MLX_REPO.replace("/", "--")) / "blobs" / config.git_oid).is_file()


def test_huggingface_hub_sees_the_imported_cache(source, target, tiny_model, tmp_path):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    export_bundle(source.store(), ["tiny"], tmp_path / "b")
    import_bundle(target.store(), tmp_path / "b")
    repos = {r.repo_id: r for r in huggingface_hub.scan_cache_dir(target.hf_cache).repos}
    assert "local/tiny" in repos and repos["local/tiny"].size_on_disk == tiny_model.size


def test_taken_name_is_refused_before_anything_is_written(source, tiny_model, tmp_path):
    store = source.store()
    export_bundle(store, ["tiny"], tmp_path / "b")
    with pytest.raises(ModelExists, match="tiny"):
        import_bundle(store, tmp_path / "b")
    assert not list(source.hf_cache.glob("models--local--tiny/blobs/*"))
    assert store.resolve("tiny").source.value == "imported"
    import_bundle(store, tmp_path / "b", replace=True)
    assert store.resolve("tiny").source.value == "bundle"


def test_cross_filesystem_import_copies_and_verifies(source, target, tiny_model, tmp_path, monkeypatch):
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem (/dev/shm) to import across")
    export_bundle(source.store(), ["tiny"], tmp_path / "b")
    target.home = Path(__import__("tempfile").mkdtemp(dir=shm, prefix="localrun-test-"))
    try:
        res = import_bundle(target.store(), tmp_path / "b")
        assert (res.linked, res.copied, res.bytes_hashed) == (0, 1, 0)  # sealed bytes: a plain kernel copy
        res = import_bundle(target.store(), tmp_path / "b", rehash=True)
        assert res.reused == 1 and res.bytes_hashed == tiny_model.size
        blob = next((tmp_path / "b").glob("hub/models--*/blobs/*"))
        assert target.store().verify("tiny").files[0].sha256 == sha256_file(blob)
    finally:
        shutil.rmtree(target.home, ignore_errors=True)


def test_copied_bundle_is_hashed_on_import(source, target, tiny_model, tmp_path):
    export_bundle(source.store(), ["tiny"], tmp_path / "b")
    shutil.copytree(tmp_path / "b", tmp_path / "copy", symlinks=True)  # new inodes: the seal no longer applies
    res = import_bundle(target.store(), tmp_path / "copy")
    assert res.linked == 1 and res.bytes_hashed == tiny_model.size


@pytest.mark.gemma
@pytest.mark.llama
@needs_llama
def test_gemma_round_trip_answers(source, target, gemma_gguf, tmp_path):
    """The real 253 MB model: store -> tar and folder -> a fresh machine -> `localrun run`."""
    rec = source.store().import_path(gemma_gguf, name="gemma3-270m")
    lock = export_bundle(source.store(), [rec.name], tmp_path / "g").lock
    assert lock.models[0].files[0].sha256 == sha256_file(gemma_gguf) and lock.models[0].architecture == "gemma3"
    export_bundle(source.store(), [rec.name], tmp_path / "g.tar")
    verify_bundle(tmp_path / "g.tar")
    target.use()
    run = subprocess.run(
        [*LOCALRUN, "bundle", "import", str(tmp_path / "g")],
        env=target.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "imported gemma3-270m" in run.stdout and "1 linked" in run.stderr
    answer = subprocess.run(
        [*LOCALRUN, "run", "gemma3-270m", "The capital of France is", "--max-tokens", "8", "--threads", "2"],
        env=target.env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip()


def test_rm_deletes_the_cache_copy_and_keeps_the_bundle(source, target, tiny_model, tmp_path):
    export_bundle(source.store(), ["tiny"], tmp_path / "b")
    store = target.store()
    import_bundle(store, tmp_path / "b")
    blob = next(target.hf_cache.glob("models--local--tiny/blobs/*"))
    store.remove("tiny")
    assert not blob.exists() and store.list() == []
    assert verify_bundle(tmp_path / "b").models[0].name == "tiny"  # the hard link's other name is intact


def test_split_model_in_a_subfolder(fake_hub, source, target, tmp_path):
    from localrun.modelstore.pull import pull
    from tests.hub.repos import SPLIT_REPO

    rec = pull(source.store(), SPLIT_REPO)
    lock = export_bundle(source.store(), [rec.name], tmp_path / "b").lock
    m = lock.models[0]
    assert m.primary == "Q8_0/Big-Q8_0-00001-of-00003.gguf" and len(m.files) == 3
    link = tmp_path / "b" / m.snapshot_relpath(m.files[0])
    assert os.readlink(link) == f"../../../blobs/{m.files[0].sha256}" and link.resolve().is_file()
    store = target.store()
    import_bundle(store, tmp_path / "b")
    got = store.resolve(rec.name)
    assert got.metadata["shards"] == 3 and len(got.files) == 3


def test_cli_names_the_bad_file(source, tiny_model, tmp_path):
    from click.testing import CliRunner

    from localrun.cli import main

    export_bundle(source.store(), ["tiny"], tmp_path / "b")
    blob = next((tmp_path / "b").glob("hub/models--*/blobs/*"))
    os.truncate(blob, 10)
    runner = CliRunner()
    for cmd in (["bundle", "verify", str(tmp_path / "b")], ["bundle", "import", str(tmp_path / "b")]):
        out = runner.invoke(main, cmd)
        assert out.exit_code != 0 and blob.name[:20] in out.output.replace("\n", "") and "lock says" in out.output, (
            out.output
        )
    ok = runner.invoke(main, ["bundle", "export", "tiny", "-o", str(tmp_path / "c.tar")])
    assert ok.exit_code == 0 and "local/tiny" in ok.output, ok.output
    ok = runner.invoke(main, ["bundle", "verify", str(tmp_path / "c.tar")])
    assert ok.exit_code == 0 and "every sha256 matches" in ok.output


def test_a_digest_named_file_gets_a_model_named_path(source, target, tiny_gguf, tmp_path):
    """Ollama keeps models as blobs/sha256-<hex>; in a bundle the file is named after the model."""
    blob = tmp_path / "ollama" / ("sha256-" + sha256_file(tiny_gguf))
    blob.parent.mkdir()
    shutil.copyfile(tiny_gguf, blob)
    source.store().import_path(blob, name="llama3.2:latest")
    m = export_bundle(source.store(), ["llama3.2:latest"], tmp_path / "b").lock.models[0]
    assert (m.repo, m.primary) == ("local/llama3.2_latest", "llama3.2-latest.gguf")
    import_bundle(target.store(), tmp_path / "b")
    assert Path(target.store().resolve("llama3.2:latest").path).name == "llama3.2-latest.gguf"


def test_export_clears_what_a_killed_export_left(source, tiny_model, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f".b.partial-{dead.pid}"
    (left / "hub").mkdir(parents=True)
    export_bundle(source.store(), ["tiny"], tmp_path / "b")
    assert not left.exists() and (tmp_path / "b" / "localrun.lock.json").is_file()
