"""Finding models other tools downloaded (HF cache, Ollama, LM Studio) in place, and verify()."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from localrun.errors import VerificationFailed
from localrun.modelstore.pull import pull
from localrun.modelstore.sources import SOURCES, discover_all
from localrun.modelstore.sources.hf_cache import discover_hf_cache
from localrun.modelstore.sources.lmstudio import discover_lmstudio, lmstudio_models_dir
from localrun.modelstore.sources.ollama import discover_ollama
from localrun.modelstore.verify import verify
from localrun.types import META_PROJECTOR, Format, ModelRecord, Source
from tests.hub import repos
from tests.support.projectors import make_projector

# --- HF cache ------------------------------------------------------------------------------


def test_hf_cache_models_fetched_by_huggingface_hub(fake_hub, hf_cache):
    from huggingface_hub import hf_hub_download, snapshot_download

    for f in ("Tiny-Q4_K_M.gguf", "Tiny-Q8_0.gguf", "extras/mmproj-Tiny-F16.gguf", "README.md"):
        hf_hub_download(repos.GGUF_REPO, f, cache_dir=hf_cache, endpoint=fake_hub.url, token=False)
    snapshot_download(
        repos.SPLIT_REPO, allow_patterns=["Q8_0/*"], cache_dir=hf_cache, endpoint=fake_hub.url, token=False
    )
    snapshot_download(
        repos.MLX_REPO,
        allow_patterns=["*.json", "*.safetensors"],
        cache_dir=hf_cache,
        endpoint=fake_hub.url,
        token=False,
    )
    found = {r.name: r for r in discover_hf_cache(hf_cache)}
    assert set(found) == {
        "testorg/tiny-gguf:q4_k_m",
        "testorg/tiny-gguf:q8_0",
        "testorg/big-gguf:q8_0",
        "mlx-community/tiny-4bit",
    }
    for r in found.values():
        assert r.source is Source.HF_CACHE and not r.owned and r.revision
    q4 = found["testorg/tiny-gguf:q4_k_m"]
    assert q4.files[0].sha256 == fake_hub.file(repos.GGUF_REPO, "Tiny-Q4_K_M.gguf").sha256
    assert q4.metadata["architecture"] == "llama" and q4.format is Format.GGUF
    big = found["testorg/big-gguf:q8_0"]
    assert len(big.files) == 3 and Path(big.path).name == "Big-Q8_0-00001-of-00003.gguf"
    assert (
        found["mlx-community/tiny-4bit"].format is Format.MLX and Path(found["mlx-community/tiny-4bit"].path).is_dir()
    )
    for r in found.values():
        verify(r)


def test_hf_cache_skips_invalid_and_missing(fake_hub, hf_cache, tmp_path):
    assert discover_hf_cache(tmp_path / "nope") == []
    fake_hub.add_repo("testorg/Broken-GGUF", {"Broken-Q4_K_M.gguf": b"GGUF" + b"\xff" * 60})
    from huggingface_hub import hf_hub_download

    hf_hub_download("testorg/Broken-GGUF", "Broken-Q4_K_M.gguf", cache_dir=hf_cache, endpoint=fake_hub.url, token=False)
    hf_hub_download(repos.GGUF_REPO, "Tiny-Q4_0.gguf", cache_dir=hf_cache, endpoint=fake_hub.url, token=False)
    assert [r.name for r in discover_hf_cache(hf_cache)] == ["testorg/tiny-gguf:q4_0"]


def test_hf_cache_default_location_comes_from_env(fake_hub, store, monkeypatch, tmp_path):
    pull(store, repos.GGUF_REPO)
    assert [r.name for r in discover_hf_cache()] == ["testorg/tiny-gguf:q4_k_m"]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert discover_hf_cache() == []


# --- Ollama --------------------------------------------------------------------------------


def _blob(root: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _manifest(root: Path, name: str, layers: list, config: dict | None = None) -> Path:
    path = root / "manifests" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json", "layers": layers}
    if config is not None:
        body["config"] = {"mediaType": "application/vnd.docker.container.image.v1+json", **config}
    path.write_text(json.dumps(body))
    return path


MODEL = "application/vnd.ollama.image.model"


@pytest.fixture
def ollama_root(_isolated_home) -> Path:
    root = Path(os.environ["OLLAMA_MODELS"])
    gguf = repos.make_gguf(seed=31)
    model = {"mediaType": MODEL, **_blob(root, gguf)}
    template = {"mediaType": "application/vnd.ollama.image.template", **_blob(root, b"{{ .Prompt }}")}
    projector = {
        "mediaType": "application/vnd.ollama.image.projector",
        **_blob(root, make_projector(seed=32)),
    }
    config = _blob(root, json.dumps({"model_format": "gguf", "model_family": "llama", "file_type": "Q4_K_M"}).encode())
    _manifest(root, "registry.ollama.ai/library/tiny/latest", [model, template], config)
    _manifest(root, "hf.co/bartowski/Tiny-GGUF/Q4_K_M", [model, projector])
    return root


def test_ollama_store_found(ollama_root):
    found = {r.name: r for r in discover_ollama()}
    assert set(found) == {"tiny:latest", "bartowski/tiny-gguf:q4_k_m"}
    tiny = found["tiny:latest"]
    assert tiny.source is Source.OLLAMA and not tiny.owned and tiny.format is Format.GGUF
    assert Path(tiny.path).parent == ollama_root / "blobs" and Path(tiny.path).name.startswith("sha256-")
    assert tiny.files[0].sha256 == Path(tiny.path).name.removeprefix("sha256-")
    assert tiny.metadata["quant"] == "Q4_K_M" and tiny.metadata["family"] == "llama"
    assert tiny.metadata["ollama"]["name"] == "registry.ollama.ai/library/tiny:latest"
    paired = found["bartowski/tiny-gguf:q4_k_m"]
    assert Path(paired.metadata[META_PROJECTOR]).exists() and paired.metadata[META_PROJECTOR] == paired.files[1].path
    verify(tiny)


def test_ollama_hostile_and_odd_manifests_are_skipped(ollama_root, tmp_path):
    good = {"mediaType": MODEL, **_blob(ollama_root, repos.make_gguf(seed=33))}
    outside = tmp_path / "secret.gguf"
    outside.write_bytes(repos.make_gguf(seed=34))
    link_digest = hashlib.sha256(outside.read_bytes()).hexdigest()
    (ollama_root / "blobs" / f"sha256-{link_digest}").symlink_to(outside)
    bad = {
        "traversal": [{"mediaType": MODEL, "digest": "sha256:../../../etc/passwd", "size": 1}],
        "uppercase": [{"mediaType": MODEL, "digest": "sha256:" + "A" * 64, "size": 1}],
        "sha512": [{"mediaType": MODEL, "digest": "sha512:" + "a" * 128, "size": 1}],
        "nul": [{"mediaType": MODEL, "digest": "sha256:" + "a" * 63 + "\x00", "size": 1}],
        "two-models": [good, good],
        "no-model": [
            {"mediaType": "application/vnd.ollama.image.template", "digest": good["digest"], "size": good["size"]}
        ],
        "missing-blob": [{"mediaType": MODEL, "digest": "sha256:" + "c" * 64, "size": 5}],
        "size-mismatch": [{**good, "size": good["size"] + 1}],
        "negative-size": [{**good, "size": -1}],
        "symlinked-blob": [{"mediaType": MODEL, "digest": f"sha256:{link_digest}", "size": outside.stat().st_size}],
        "layer-not-object": ["sha256:" + "a" * 64],
    }
    for tag, layers in bad.items():
        _manifest(ollama_root, f"registry.ollama.ai/library/bad/{tag}", layers)
    (ollama_root / "manifests/registry.ollama.ai/library/bad/notjson").write_text("{nope")
    (ollama_root / "manifests/registry.ollama.ai/library/bad/list").write_text("[]")
    _manifest(ollama_root, "registry.ollama.ai/library/Bad Name/latest", [good])
    assert {r.name for r in discover_ollama()} == {"tiny:latest", "bartowski/tiny-gguf:q4_k_m"}


def test_ollama_missing_store_is_empty(tmp_path):
    assert discover_ollama(tmp_path / "none") == []


# --- LM Studio -----------------------------------------------------------------------------


def _lmstudio_tree(models: Path) -> None:
    repo = models / "lmstudio-community" / "Tiny-GGUF"
    repo.mkdir(parents=True)
    (repo / "Tiny-Q4_K_M.gguf").write_bytes(repos.make_gguf(seed=41))
    (repo / "Tiny-Q8_0.gguf").write_bytes(repos.make_gguf(quant="Q8_0", seed=42))
    (repo / "mmproj-Tiny-F16.gguf").write_bytes(repos.make_gguf(quant="F16", seed=43))
    split = models / "lmstudio-community" / "Big-GGUF"
    split.mkdir()
    for name, data in repos.split_repo_files().items():
        if name.startswith("Q8_0/"):
            (split / Path(name).name).write_bytes(data)
    mlx = models / "mlx-community" / "Tiny-4bit"
    mlx.mkdir(parents=True)
    for name, data in repos.mlx_repo_files().items():
        if name != "pytorch_model.bin":
            (mlx / name).write_bytes(data)
    (models / "loose.gguf").write_bytes(repos.make_gguf(seed=44))  # not publisher/repo/file: LM Studio ignores it
    linked = models / "someone" / "Linked-GGUF"
    linked.mkdir(parents=True)
    (linked / "Linked-Q4_K_M.gguf").symlink_to(repo / "Tiny-Q4_K_M.gguf")  # symlinks are ignored


EXPECTED_LMS = {
    "lmstudio-community/tiny-gguf:q4_k_m",
    "lmstudio-community/tiny-gguf:q8_0",
    "lmstudio-community/big-gguf:q8_0",
    "mlx-community/tiny-4bit",
}


def test_lmstudio_default_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    _lmstudio_tree(tmp_path / ".lmstudio" / "models")
    found = {r.name: r for r in discover_lmstudio()}
    assert set(found) == EXPECTED_LMS
    assert all(r.source is Source.LMSTUDIO and not r.owned for r in found.values())
    assert len(found["lmstudio-community/big-gguf:q8_0"].files) == 3
    assert found["mlx-community/tiny-4bit"].format is Format.MLX
    report = verify(found["lmstudio-community/tiny-gguf:q4_k_m"])
    assert report.unverifiable and not report.checked  # LM Studio keeps no hashes


def test_lmstudio_home_pointer_and_downloads_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    home = tmp_path / "custom-home"
    home.mkdir()
    (tmp_path / ".lmstudio-home-pointer").write_text(str(home) + "\n")
    assert lmstudio_models_dir() == home / "models"
    _lmstudio_tree(tmp_path / "big-disk" / "llms")
    (home / "settings.json").write_text(json.dumps({"downloadsFolder": str(tmp_path / "big-disk" / "llms")}))
    assert {r.name for r in discover_lmstudio()} == EXPECTED_LMS


def test_lmstudio_legacy_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    _lmstudio_tree(tmp_path / ".cache" / "lm-studio" / "models")
    assert {r.name for r in discover_lmstudio()} == EXPECTED_LMS


def test_discover_all_combines_sources(ollama_root, store, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    _lmstudio_tree(tmp_path / ".lmstudio" / "models")
    sources = {r.source for r in discover_all(store.settings)}
    assert sources == {Source.OLLAMA, Source.LMSTUDIO}


def test_discovery_loops_over_the_source_registry(store, monkeypatch, tmp_path):
    """A store source is one module and one registry entry: discover_all asks every entry, in order."""
    assert list(SOURCES) == ["hf-cache", "ollama", "lmstudio"]
    assert [s.source for s in SOURCES.values()] == [Source.HF_CACHE, Source.OLLAMA, Source.LMSTUDIO]
    monkeypatch.setenv("HOME", str(tmp_path))
    asked = []
    found = ModelRecord(name="elsewhere:latest", format=Format.GGUF, path=str(tmp_path / "m.gguf"), files=())

    def discover(location=None, *, read_metadata=True):
        asked.append(read_metadata)
        return [found]

    monkeypatch.setitem(SOURCES, "elsewhere", dataclasses.replace(SOURCES["ollama"], discover=discover))
    assert discover_all(store.settings, read_metadata=False) == [found]
    assert asked == [False]


# --- verify --------------------------------------------------------------------------------


def test_flipped_byte_is_named_by_verify(fake_hub, store):
    record = pull(store, repos.SPLIT_REPO)
    assert len(verify(record).checked) == 3
    target = Path(record.files[1].path).resolve()
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x40
    target.write_bytes(bytes(data))
    with pytest.raises(VerificationFailed) as err:
        verify(record)
    assert "Big-Q8_0-00002-of-00003.gguf" in str(err.value)
    assert "00001" not in str(err.value) and "00003-of" not in str(err.value)


def test_verify_names_missing_and_resized_files(fake_hub, store):
    record = pull(store, repos.MLX_REPO)
    files = {Path(e.path).name: Path(e.path) for e in record.files}
    files["tokenizer.json"].unlink()
    files["config.json"].resolve().write_bytes(b"{}")
    with pytest.raises(VerificationFailed) as err:
        verify(record)
    assert "tokenizer.json: missing" in str(err.value) and "config.json" in str(err.value)
