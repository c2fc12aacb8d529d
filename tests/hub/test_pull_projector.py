"""Pulling a vision repo from the fake hub: the model and the projector llama.cpp's ``-hf``
would pick come down together, verified, and stay together through verify, rm and offline.

The repos hold real GGUF headers: tiny llama-arch models (16-wide) and tiny clip
projectors (tests.support.projectors), so the store's checks run on real bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from localrun.cli import main
from localrun.errors import InvalidModelFile, ModelNotFound, VerificationFailed
from localrun.modelstore.capabilities import media as capabilities
from localrun.modelstore.projector import PROJECTOR_INFO
from localrun.modelstore.pull import plan_pull, pull
from localrun.types import META_PROJECTOR, VISION
from tests.hub import repos
from tests.support.projectors import make_projector

VISION_REPO = "visionorg/Seeing-GGUF"
NESTED_REPO = "visionorg/Nested-GGUF"


def _vision_files() -> dict[str, bytes]:
    return {
        "Seeing-Q4_K_M.gguf": repos.make_gguf(quant="Q4_K_M", seed=301),
        "Seeing-F16.gguf": repos.make_gguf(quant="F16", seed=302),
        "mmproj-Seeing-F16.gguf": make_projector(seed=1),
        "mmproj-Seeing-Q8_0.gguf": make_projector(seed=2, file_type=7),
        "README.md": b"# seeing\n",
    }


@pytest.fixture
def vision_hub(fake_hub):
    fake_hub.add_repo(VISION_REPO, _vision_files())
    fake_hub.add_repo(
        NESTED_REPO,
        {
            "Q4_K_M/Nested-Q4_K_M.gguf": repos.make_gguf(quant="Q4_K_M", seed=303),
            "Q4_K_M/mmproj-F16.gguf": make_projector(seed=3),
            "mmproj-Q4_0.gguf": make_projector(seed=4, file_type=2),  # closer bits, but a shallower folder
            "other/mmproj-Q4_K_M.gguf": make_projector(seed=5),  # a sibling folder: never this model's
        },
    )
    return fake_hub


def test_pull_takes_the_projector_llamacpp_picks(vision_hub, store):
    plan = plan_pull(f"{VISION_REPO}:Q4_K_M")
    # two projectors: the one whose bit count is closest to the model's (8 vs 16, for a 4-bit model)
    assert plan.projector == "mmproj-Seeing-Q8_0.gguf"
    assert [f.path for f in plan.files] == ["Seeing-Q4_K_M.gguf", "mmproj-Seeing-Q8_0.gguf"]
    assert any("(projector)" in line and "mmproj-Seeing-Q8_0.gguf" in line for line in plan.describe())
    record = pull(store, plan)
    proj = record.metadata[META_PROJECTOR]
    assert Path(proj).name == "mmproj-Seeing-Q8_0.gguf" and Path(proj).is_absolute()
    assert [Path(e.path).name for e in record.files] == ["Seeing-Q4_K_M.gguf", "mmproj-Seeing-Q8_0.gguf"]
    entry = record.files[1]
    assert entry.path == proj and entry.sha256 == vision_hub.file(VISION_REPO, "mmproj-Seeing-Q8_0.gguf").sha256
    assert record.path.endswith("Seeing-Q4_K_M.gguf") and record.metadata["architecture"] == "llama"
    assert record.metadata["size_bytes"] == record.files[0].size  # the model's header facts, not the projector's
    assert record.metadata[PROJECTOR_INFO]["owned"] is True and capabilities(record) == (VISION,)
    assert store.index.get(record.name) == record
    # the F16 model takes the F16 projector
    assert plan_pull(f"{VISION_REPO}:F16").projector == "mmproj-Seeing-F16.gguf"


def test_deepest_folder_wins_and_sibling_folders_never_pair(vision_hub, store):
    assert plan_pull(NESTED_REPO).projector == "Q4_K_M/mmproj-F16.gguf"
    record = pull(store, NESTED_REPO)
    assert Path(record.metadata[META_PROJECTOR]).parent.name == "Q4_K_M"
    # the standard repo keeps its llama-arch stand-in in extras/: never paired, never the model
    plain = pull(store, repos.GGUF_REPO)
    assert META_PROJECTOR not in plain.metadata and len(plain.files) == 1


def test_no_mmproj_and_a_projector_named_as_the_model(vision_hub, store):
    plan = plan_pull(VISION_REPO, mmproj=False)
    assert plan.projector is None and [f.path for f in plan.files] == ["Seeing-Q4_K_M.gguf"]
    record = pull(store, plan)
    assert META_PROJECTOR not in record.metadata and capabilities(record) == ()
    with pytest.raises(ModelNotFound, match="multimodal projector, not a model"):
        plan_pull(f"{VISION_REPO}/mmproj-Seeing-F16.gguf")


def test_offline_pull_finds_the_pair_in_the_cache(vision_hub, store):
    online = pull(store, VISION_REPO)
    vision_hub.reset_log()
    offline = pull(store, VISION_REPO, offline=True)
    assert vision_hub.requests == []
    assert offline.files == online.files and offline.metadata[META_PROJECTOR] == online.metadata[META_PROJECTOR]
    # offline, a projector never fetched is simply not there: the model comes alone
    pull(store, "visionorg/Nested-GGUF", mmproj=False)
    assert META_PROJECTOR not in pull(store, NESTED_REPO, offline=True).metadata


def test_a_repo_projector_that_does_not_fit_is_refused_by_name(fake_hub, store):
    fake_hub.add_repo(
        "visionorg/Mismatched-GGUF",
        {"M-Q4_K_M.gguf": repos.make_gguf(seed=310), "mmproj-M-F16.gguf": make_projector(n_embd=2560, seed=6)},
    )
    fake_hub.add_repo(
        "visionorg/Fake-Projector-GGUF",
        {"M-Q4_K_M.gguf": repos.make_gguf(seed=311), "mmproj-M-F16.gguf": repos.make_gguf(name="mmproj", seed=7)},
    )
    with pytest.raises(InvalidModelFile, match=r"mmproj-M-F16.gguf cannot be this model's projector.*2560") as exc:
        pull(store, "visionorg/Mismatched-GGUF")
    assert "--no-mmproj" in exc.value.hint and store.list() == []
    with pytest.raises(InvalidModelFile, match="not a multimodal projector"):
        pull(store, "visionorg/Fake-Projector-GGUF")
    assert META_PROJECTOR not in pull(store, "visionorg/Fake-Projector-GGUF", mmproj=False).metadata


def test_verify_and_rm_carry_the_projector(vision_hub, store):
    record = pull(store, VISION_REPO)
    proj = Path(record.metadata[META_PROJECTOR])
    blob = proj.resolve()
    store.verify(record.name)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(VerificationFailed, match="mmproj-Seeing-Q8_0.gguf"):
        store.verify(record.name)
    with pytest.raises(VerificationFailed, match="mmproj-Seeing-Q8_0.gguf"):
        store.resolve(record.name)  # a file touched since it last matched is re-hashed before use
    model_blob = Path(record.path).resolve()
    store.remove(record.name)
    assert not proj.exists() and not blob.exists() and not model_blob.exists()


def test_cli_pull_ls_and_no_mmproj(vision_hub):
    runner = CliRunner()
    result = runner.invoke(main, ["pull", "-y", f"{VISION_REPO}:Q4_K_M"])
    assert result.exit_code == 0, result.output
    assert "vision (projector mmproj-Seeing-Q8_0.gguf)" in " ".join(result.output.split())  # rich wraps at 80
    rows = json.loads(runner.invoke(main, ["ls", "--json"]).output)
    (row,) = rows
    assert row["capabilities"] == ["completion", "vision"] and Path(row["projector"]).name == "mmproj-Seeing-Q8_0.gguf"
    table = runner.invoke(main, ["ls"], env={"COLUMNS": "200"}).output
    assert "Capabilities" in table and "vision" in table
    result = runner.invoke(main, ["pull", "-y", "--no-mmproj", f"{VISION_REPO}:F16"])
    assert result.exit_code == 0 and "projector" not in result.output
    rows = {r["name"]: r for r in json.loads(runner.invoke(main, ["ls", "--json"]).output)}
    f16 = rows["visionorg/seeing-gguf:f16"]
    assert f16["capabilities"] == ["completion"] and f16["projector"] is None


def test_rm_never_deletes_a_projector_paired_by_hand(vision_hub, store, hf_cache):
    """A pulled (owned) model given another tool's projector from the HF cache: rm deletes the
    model's files and leaves that projector, which localrun did not write."""
    from huggingface_hub import hf_hub_download

    theirs = Path(
        hf_hub_download(NESTED_REPO, "mmproj-Q4_0.gguf", cache_dir=hf_cache, endpoint=vision_hub.url, token=False)
    )
    record = pull(store, repos.GGUF_REPO)
    paired = store.pair_projector(record.name, theirs)
    assert paired.metadata[META_PROJECTOR] == str(theirs) and paired.metadata[PROJECTOR_INFO]["owned"] is False
    store.remove(record.name)
    assert not Path(record.path).exists() and theirs.exists() and theirs.resolve().exists()
