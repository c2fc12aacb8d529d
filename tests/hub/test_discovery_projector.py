"""Discovery pairs the projectors other tools keep beside their models, and never lists a
projector as a model: LM Studio folders, HF-cache snapshots (what ``hf download`` or
llama.cpp's ``-hf`` left), Ollama's projector layer. Real GGUF headers throughout."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from localrun.modelstore.capabilities import media as capabilities
from localrun.modelstore.projector import PROJECTOR_INFO
from localrun.modelstore.sources.hf_cache import discover_hf_cache
from localrun.modelstore.sources.lmstudio import discover_lmstudio
from localrun.modelstore.sources.ollama import discover_ollama
from localrun.modelstore.verify import verify
from localrun.types import AUDIO, META_PROJECTOR, VISION
from tests.hub import repos
from tests.support.projectors import make_projector


def test_lmstudio_folder_pairs_the_mmproj_beside_the_model(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    repo = tmp_path / ".lmstudio" / "models" / "lmstudio-community" / "gemma-3-4b-it-GGUF"
    repo.mkdir(parents=True)
    (repo / "gemma-3-4b-it-Q4_K_M.gguf").write_bytes(repos.make_gguf(seed=501))
    (repo / "gemma-3-4b-it-F16.gguf").write_bytes(repos.make_gguf(quant="F16", seed=502))
    (repo / "mmproj-model-f16.gguf").write_bytes(make_projector(seed=21))
    (repo / "vision-tower.gguf").write_bytes(make_projector(seed=22))  # a clip file under another name
    found = {r.name: r for r in discover_lmstudio()}
    assert set(found) == {"lmstudio-community/gemma-3-4b-it-gguf:q4_k_m", "lmstudio-community/gemma-3-4b-it-gguf:f16"}
    for rec in found.values():  # one projector in the folder: both quants see through it
        assert rec.metadata[META_PROJECTOR] == str(repo / "mmproj-model-f16.gguf")
        assert rec.files[-1].path == str(repo / "mmproj-model-f16.gguf") and capabilities(rec) == (VISION,)
        assert rec.metadata[PROJECTOR_INFO]["owned"] is False and not rec.owned
    assert verify(found["lmstudio-community/gemma-3-4b-it-gguf:f16"]).unverifiable  # both files, no hashes kept
    quick = {r.name: r for r in discover_lmstudio(read_metadata=False)}  # the fast scan still records the pair
    fast = quick["lmstudio-community/gemma-3-4b-it-gguf:q4_k_m"]
    assert fast.metadata[META_PROJECTOR].endswith("mmproj-model-f16.gguf")


def test_hf_cache_snapshot_pairs_and_never_lists_the_projector(fake_hub, hf_cache):
    from huggingface_hub import hf_hub_download

    fake_hub.add_repo(
        "visionorg/Omni-GGUF",
        {
            "Omni-Q4_K_M.gguf": repos.make_gguf(seed=503),
            "mmproj-Omni-F16.gguf": make_projector(vision=True, audio=True, seed=23),
            "mmproj-Omni-Q8_0.gguf": make_projector(vision=True, audio=True, seed=24, file_type=7),
        },
    )
    for f in ("Omni-Q4_K_M.gguf", "mmproj-Omni-F16.gguf", "mmproj-Omni-Q8_0.gguf"):
        hf_hub_download("visionorg/Omni-GGUF", f, cache_dir=hf_cache, endpoint=fake_hub.url, token=False)
    (rec,) = discover_hf_cache(hf_cache)
    assert rec.name == "visionorg/omni-gguf:q4_k_m"
    assert Path(rec.metadata[META_PROJECTOR]).name == "mmproj-Omni-Q8_0.gguf"  # llama.cpp's pick, as online
    assert rec.files[-1].sha256 == fake_hub.file("visionorg/Omni-GGUF", "mmproj-Omni-Q8_0.gguf").sha256
    assert capabilities(rec) == (VISION, AUDIO)
    verify(rec)


def _blob(root: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _manifest(root: Path, name: str, layers: list) -> None:
    path = root / "manifests" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))


def test_ollama_projector_layer_is_paired(_isolated_home):
    root = Path(os.environ["OLLAMA_MODELS"])
    model = {"mediaType": "application/vnd.ollama.image.model", **_blob(root, repos.make_gguf(seed=504))}
    projector = {"mediaType": "application/vnd.ollama.image.projector", **_blob(root, make_projector(seed=25))}
    wrong = {"mediaType": "application/vnd.ollama.image.projector", **_blob(root, repos.make_gguf(seed=505))}
    _manifest(root, "registry.ollama.ai/library/gemma3/4b", [model, projector])
    _manifest(root, "registry.ollama.ai/library/odd/latest", [model, wrong])  # a "projector" that is not one
    found = {r.name: r for r in discover_ollama()}
    assert set(found) == {"gemma3:4b", "odd:latest"}
    gemma = found["gemma3:4b"]
    blob = root / "blobs" / f"sha256-{projector['digest'].removeprefix('sha256:')}"
    assert gemma.metadata[META_PROJECTOR] == str(blob) and gemma.files[-1].path == str(blob)
    assert gemma.files[-1].sha256 == projector["digest"].removeprefix("sha256:") and capabilities(gemma) == (VISION,)
    verify(gemma)  # Ollama's digests are sha256: both files are checked
    odd = found["odd:latest"]
    assert META_PROJECTOR not in odd.metadata and len(odd.files) == 1 and capabilities(odd) == ()
