"""Pulling from the fake hub: plans, formats, progress, revisions, offline, mirrors, auth,
code refusals, search, and interop with huggingface_hub's own cache functions."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from localrun.errors import AccessDenied, DownloadFailed, InvalidModelFile, ModelNotFound, VerificationFailed
from localrun.modelstore.pull import plan_pull, pull
from localrun.types import Format, Source
from tests.hub import repos
from tests.hub.fakehub import FakeHub


def sha(p) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def resolve_gets(hub: FakeHub) -> list:
    return [r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path]


def test_plan_shows_files_sizes_and_quant_before_downloading(fake_hub, store):
    plan = plan_pull("testorg/Tiny-GGUF:Q5_K_M")
    f = fake_hub.file(repos.GGUF_REPO, "Tiny-Q5_K_M.gguf")
    assert [(p.path, p.size, p.sha256, p.cached) for p in plan.files] == [
        ("Tiny-Q5_K_M.gguf", len(f.data), f.sha256, False)
    ]
    assert plan.quant == "Q5_K_M" and plan.name == "testorg/tiny-gguf:q5_k_m" and plan.format is Format.GGUF
    assert plan.download_bytes == len(f.data)
    text = "\n".join(plan.describe())
    assert "Tiny-Q5_K_M.gguf" in text and "Q5_K_M" in text
    assert resolve_gets(fake_hub) == []  # planning downloads nothing


def test_pull_default_quant_registers_a_verified_record(fake_hub, store, hf_cache):
    record = pull(store, "testorg/Tiny-GGUF")
    expected = fake_hub.file(repos.GGUF_REPO, "Tiny-Q4_K_M.gguf")
    assert record.name == "testorg/tiny-gguf:q4_k_m"
    assert record.source is Source.HUB and record.owned and record.repo == repos.GGUF_REPO
    assert record.revision == fake_hub.repos[repos.GGUF_REPO].refs["main"]
    assert Path(record.path).read_bytes() == expected.data
    assert [(Path(e.path).name, e.size, e.sha256) for e in record.files] == [
        ("Tiny-Q4_K_M.gguf", len(expected.data), expected.sha256)
    ]
    assert record.metadata["architecture"] == "llama" and record.metadata["quant"] == "Q4_K_M"
    # HF cache layout: snapshot symlink -> ../../blobs/<sha256>, refs/main -> commit
    snap = Path(record.path)
    assert snap.is_symlink() and not os.path.isabs(os.readlink(snap))
    assert snap.resolve() == (hf_cache / "models--testorg--Tiny-GGUF" / "blobs" / expected.sha256).resolve()
    assert (hf_cache / "models--testorg--Tiny-GGUF" / "refs" / "main").read_text() == record.revision
    assert store.index.get(record.name).files == record.files


def test_pull_case_insensitive_quant_and_hf_prefix(fake_hub, store):
    record = pull(store, "hf.co/testorg/Tiny-GGUF:q8_0")
    assert record.name == "testorg/tiny-gguf:q8_0"
    assert sha(record.path) == fake_hub.file(repos.GGUF_REPO, "Tiny-Q8_0.gguf").sha256


def test_pull_exact_file(fake_hub, store):
    record = pull(store, "testorg/Tiny-GGUF/Tiny-F16.gguf")
    assert Path(record.path).name == "Tiny-F16.gguf" and record.name == "testorg/tiny-gguf:f16"


def test_split_pull_fetches_all_parts_loads_first(fake_hub, store):
    record = pull(store, repos.SPLIT_REPO)
    names = [Path(e.path).name for e in record.files]
    assert names == [f"Big-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert Path(record.path).name == names[0] and record.metadata["split_count"] == 3
    for e in record.files:
        assert sha(e.path) == e.sha256 == fake_hub.file(repos.SPLIT_REPO, f"Q8_0/{Path(e.path).name}").sha256


def test_mlx_and_mlc_pulls(fake_hub, store):
    mlx = pull(store, repos.MLX_REPO)
    assert mlx.format is Format.MLX and Path(mlx.path).is_dir() and mlx.name == "mlx-community/tiny-4bit"
    assert (Path(mlx.path) / "config.json").exists() and not (Path(mlx.path) / "pytorch_model.bin").exists()
    assert mlx.metadata["quant"] == "4bit"
    mlc = pull(store, repos.MLC_REPO)
    assert mlc.format is Format.MLC and (Path(mlc.path) / "mlc-chat-config.json").exists()
    assert {Path(e.path).name for e in mlc.files} >= {"tensor-cache.json", "params_shard_0.bin", "params_shard_1.bin"}
    assert mlc.metadata["quant"] == "q4f16_1"
    for e in mlx.files + mlc.files:
        assert sha(e.path) == e.sha256


def test_progress_callback_reports_speed_and_eta(fake_hub, store):
    big = repos.make_gguf(payload=3 * 1024 * 1024, seed=5)
    fake_hub.add_repo("testorg/Mid-GGUF", {"Mid-Q4_K_M.gguf": big})
    fake_hub.faults.throttle_bps = 8 * 1024 * 1024
    events = []
    pull(store, "testorg/Mid-GGUF", progress=events.append)
    downloading = [e for e in events if e.phase == "downloading"]
    assert downloading and all(e.total == len(big) for e in events)
    assert [e.done for e in downloading] == sorted(e.done for e in downloading)
    assert all(e.speed > 0 and e.eta is not None for e in downloading)
    assert events[-1].phase == "done" and events[-1].done == len(big)


def test_repull_reuses_verified_files_without_downloading(fake_hub, store):
    first = pull(store, "testorg/Tiny-GGUF")
    fake_hub.reset_log()
    plan = plan_pull("testorg/Tiny-GGUF")
    assert all(f.cached for f in plan.files) and plan.download_bytes == 0
    second = pull(store, plan)
    assert resolve_gets(fake_hub) == [] and second.files == first.files
    assert [r.name for r in store.index.list()] == [first.name]


def test_revision(fake_hub, store, hf_cache):
    v1 = {"Tiny-Q4_K_M.gguf": repos.make_gguf(seed=77)}
    commit = fake_hub.add_revision(repos.GGUF_REPO, "v1", v1)
    record = pull(store, repos.GGUF_REPO, revision="v1")
    assert record.revision == commit and sha(record.path) == hashlib.sha256(v1["Tiny-Q4_K_M.gguf"]).hexdigest()
    assert (hf_cache / "models--testorg--Tiny-GGUF" / "refs" / "v1").read_text() == commit
    with pytest.raises(ModelNotFound, match="no-such-branch"):
        plan_pull(repos.GGUF_REPO, revision="no-such-branch")


def test_unknown_repo_and_unknown_quant(fake_hub, store):
    with pytest.raises(ModelNotFound, match="nobody/nothing"):
        pull(store, "nobody/nothing")
    with pytest.raises(ModelNotFound) as err:
        pull(store, "testorg/Tiny-GGUF:Q3_K_S")
    assert "Q5_K_M" in str(err.value) and "Q4_K_M" in str(err.value)


def test_offline_uses_local_files_only(fake_hub, store, monkeypatch):
    online = pull(store, repos.SPLIT_REPO)
    fake_hub.reset_log()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = pull(store, repos.SPLIT_REPO)
    assert fake_hub.requests == []
    assert offline.files == online.files and offline.revision == online.revision
    with pytest.raises(ModelNotFound, match=r"offline.*testorg/Tiny-GGUF"):
        pull(store, repos.GGUF_REPO)
    assert fake_hub.requests == []


def test_offline_names_missing_parts_and_refuses_bad_bytes(fake_hub, store):
    record = pull(store, repos.SPLIT_REPO)
    Path(record.files[1].path).unlink()
    with pytest.raises(ModelNotFound, match="00002-of-00003"):
        pull(store, repos.SPLIT_REPO, offline=True)
    record = pull(store, repos.SPLIT_REPO)  # online again: the missing link is restored
    blob = Path(record.files[2].path).resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(VerificationFailed, match="00003-of-00003"):
        pull(store, repos.SPLIT_REPO, offline=True)


def test_settings_endpoint_overrides_hf_endpoint(fake_hub, store):
    mirror = FakeHub()
    mirror.add_repo("mirrororg/Only-On-Mirror", {"M-Q4_K_M.gguf": repos.make_gguf(seed=3)})
    mirror.start()
    try:
        store.settings.hub.endpoint = mirror.url
        record = pull(store, "mirrororg/Only-On-Mirror")
        assert record.metadata["hub"]["endpoint"] == mirror.url
        assert resolve_gets(mirror) and not resolve_gets(fake_hub)
    finally:
        mirror.stop()


def test_hf_endpoint_mirror(fake_hub, store, monkeypatch):
    mirror = FakeHub().share_repos_with(fake_hub).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", mirror.url + "/")
        pull(store, repos.GGUF_REPO)
        assert resolve_gets(mirror) and fake_hub.requests == []
    finally:
        mirror.stop()


def test_gated_repo_without_and_with_token(fake_hub, store, monkeypatch):
    with pytest.raises(AccessDenied) as err:
        pull(store, repos.GATED_REPO)
    assert repos.GATED_REPO in str(err.value) and "hf auth login" in str(err.value) and "HF_TOKEN" in str(err.value)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(AccessDenied, match="refused"):
        pull(store, repos.GATED_REPO)
    monkeypatch.setenv("HF_TOKEN", repos.GATED_TOKEN)
    record = pull(store, repos.GATED_REPO)
    assert sha(record.path) == fake_hub.file(repos.GATED_REPO, "Secret-Q4_K_M.gguf").sha256
    assert all(r.authorization == f"Bearer {repos.GATED_TOKEN}" for r in resolve_gets(fake_hub))


def test_mlx_code_refused_unless_trusted(fake_hub, store, hf_cache):
    fake_hub.add_repo(
        "mlx-community/Code-4bit", repos.mlx_repo_files(extra={"modeling_evil.py": b"open('/tmp/pwned','w')"})
    )
    with pytest.raises(InvalidModelFile, match="modeling_evil.py"):
        pull(store, "mlx-community/Code-4bit")
    assert not (hf_cache / "models--mlx-community--Code-4bit").exists() and resolve_gets(fake_hub) == []
    record = pull(store, "mlx-community/Code-4bit", trust_remote_code=True)
    assert (Path(record.path) / "modeling_evil.py").exists()


@pytest.mark.parametrize("key", ["model_file", "auto_map"])
def test_mlx_config_code_keys_refused_before_weights(fake_hub, store, key):
    fake_hub.add_repo("mlx-community/Keys-4bit", repos.mlx_repo_files(config_extra={key: "evil.py"}))
    with pytest.raises(InvalidModelFile, match=key):
        pull(store, "mlx-community/Keys-4bit")
    fetched = [Path(r.path).name for r in resolve_gets(fake_hub)]
    assert fetched == ["config.json"]  # no weight was fetched
    assert store.index.find("mlx-community/keys-4bit") is None


def test_mlc_native_library_refused_by_default(fake_hub, store):
    fake_hub.add_repo("mlc-ai/Native-MLC", repos.mlc_repo_files(extra={"Native-cuda.so": b"\x7fELF..."}))
    with pytest.raises(InvalidModelFile, match="Native-cuda.so"):
        pull(store, "mlc-ai/Native-MLC")
    assert resolve_gets(fake_hub) == []
    record = pull(store, "mlc-ai/Native-MLC", allow_native=True)
    assert (Path(record.path) / "Native-cuda.so").exists()


def test_legacy_ndarray_cache_mlc(fake_hub, store):
    fake_hub.add_repo("mlc-ai/Old-MLC", repos.mlc_repo_files(legacy_cache_name=True))
    record = pull(store, "mlc-ai/Old-MLC")
    assert (Path(record.path) / "ndarray-cache.json").exists()


def test_search(fake_hub, monkeypatch):
    from localrun.modelstore.hub import search

    hits = search("tiny")
    assert [h.name for h in hits] == [repos.GGUF_REPO, repos.MLX_REPO, repos.MLC_REPO]
    assert (hits[0].downloads, hits[0].likes) == (500, 7) and hits[0].updated is not None
    assert [h.name for h in search("", format="gguf")] == [repos.GGUF_REPO, repos.SPLIT_REPO, repos.GATED_REPO]
    assert [h.name for h in search("tiny", format=Format.MLX)] == [repos.MLX_REPO]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadFailed, match="offline"):
        search("tiny")


def test_unreachable_hub_is_a_clear_error(fake_hub, store, monkeypatch):
    dead = FakeHub().start()
    url = dead.url
    dead.stop()
    monkeypatch.setenv("HF_ENDPOINT", url)
    with pytest.raises(DownloadFailed, match="cannot reach"):
        pull(store, repos.GGUF_REPO)


# --- interop with huggingface_hub ------------------------------------------------------


def test_scan_cache_dir_sees_pulled_models(fake_hub, store, hf_cache):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    record = pull(store, repos.SPLIT_REPO)
    info = scan_cache_dir(hf_cache)
    repo = next(r for r in info.repos if r.repo_id == repos.SPLIT_REPO)
    rev = next(iter(repo.revisions))
    assert rev.commit_hash == record.revision and "main" in rev.refs
    assert {f.file_name for f in rev.files} == {Path(e.path).name for e in record.files}
    assert repo.size_on_disk == record.size and not info.warnings
    cached = try_to_load_from_cache(repos.SPLIT_REPO, "Q8_0/Big-Q8_0-00002-of-00003.gguf", cache_dir=hf_cache)
    assert Path(cached) == Path(record.files[1].path)


def test_file_from_hf_hub_download_is_reused(fake_hub, store, hf_cache):
    from huggingface_hub import hf_hub_download

    theirs = hf_hub_download(
        repos.GGUF_REPO, "Tiny-Q4_K_M.gguf", cache_dir=hf_cache, endpoint=fake_hub.url, token=False
    )
    fake_hub.reset_log()
    record = pull(store, repos.GGUF_REPO)
    assert resolve_gets(fake_hub) == []
    assert Path(record.path) == Path(theirs) and record.files[0].sha256 == sha(theirs)


def test_hf_hub_download_reuses_what_localrun_pulled(fake_hub, store, hf_cache):
    from huggingface_hub import hf_hub_download

    record = pull(store, repos.MLX_REPO)
    fake_hub.reset_log()
    got = hf_hub_download(
        repos.MLX_REPO,
        "model-00001-of-00002.safetensors",
        cache_dir=hf_cache,
        endpoint=fake_hub.url,
        token=False,
        local_files_only=True,
    )
    assert Path(got) == Path(record.path) / "model-00001-of-00002.safetensors" and fake_hub.requests == []


def test_split_parts_that_do_not_belong_together_are_not_registered(fake_hub, store):
    files = repos.split_repo_files()
    files["Q8_0/Big-Q8_0-00002-of-00003.gguf"] = repos.make_gguf(
        quant="Q8_0", split=(0, 3), seed=99
    )  # a second "first" shard
    fake_hub.add_repo("testorg/Mixed-GGUF", files)
    with pytest.raises(InvalidModelFile, match="00002-of-00003"):
        pull(store, "testorg/Mixed-GGUF")
    assert store.index.find("testorg/mixed-gguf:q8_0") is None


def test_invalid_gguf_from_the_hub_is_not_registered(fake_hub, store):
    fake_hub.add_repo("testorg/Broken-GGUF", {"Broken-Q4_K_M.gguf": b"GGUF" + b"\xff" * 60})
    with pytest.raises(InvalidModelFile):
        pull(store, "testorg/Broken-GGUF")
    assert store.list() == []
