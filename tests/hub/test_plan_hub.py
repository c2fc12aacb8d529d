"""`plan ORG/REPO[:QUANT]` on a repo not in the store asks the hub: sizes from its listing, the GGUF
header by range requests, nothing downloaded; offline it says it could not ask and what to do (issue 33)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from localrun.cli import main
from tests.hub import repos


def plan(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["plan", *args, "--runtime", "fake"], env=env, catch_exceptions=False)


def test_plan_reads_a_hub_repo_without_downloading_it(fake_hub, store, hf_cache):
    out = plan("testorg/Tiny-GGUF", "--json")
    assert out.exit_code == 0, out.output
    answer = json.loads(out.stdout)
    assert answer["model"] == "testorg/tiny-gguf:q4_k_m"
    assert "not in the store: read from " + fake_hub.url in out.stderr and "nothing downloaded" in out.stderr
    full = fake_hub.file(repos.GGUF_REPO, "Tiny-Q4_K_M.gguf")
    gets = [r for r in fake_hub.requests if r.method == "GET" and r.path.endswith("Tiny-Q4_K_M.gguf")]
    assert gets and all(r.range and r.status == 206 for r in gets), gets
    assert sum(r.bytes_sent for r in gets) <= len(full.data)
    assert store.list() == [] and not list(hf_cache.rglob("*.gguf")), "planning downloads and registers nothing"


def test_plan_in_words_names_the_quant_and_reads_every_shard(fake_hub, store):
    from localrun.modelstore.hub_header import hub_record

    q8 = plan("hf.co/testorg/Tiny-GGUF:Q8_0")
    assert q8.exit_code == 0, q8.output
    assert "testorg/tiny-gguf:q8_0" in q8.stdout or "Q8_0" in q8.stdout
    big = hub_record("testorg/Big-GGUF:Q8_0")
    assert big.metadata["shards"] == 3 and len(big.files) == 3
    assert big.metadata["architecture"] == "llama" and big.metadata["n_params"] > 0
    assert big.size == sum(len(data) for path, data in repos.split_repo_files().items() if path.startswith("Q8_0/"))


def test_plan_offline_says_it_could_not_ask_the_hub(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    out = plan("testorg/Tiny-GGUF")
    assert out.exit_code != 0
    assert "is not in the store, and the hub could not be asked" in out.output, out.output
    assert "HF_ENDPOINT" in out.output
    unknown = plan("nosuchmodel")
    assert unknown.exit_code == 3 and "no model named 'nosuchmodel'" in unknown.output


def test_plan_with_hf_hub_offline_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = plan("testorg/Tiny-GGUF")
    assert out.exit_code == 3 and "is not in the store, and the hub says: offline" in out.output, out.output


def test_show_reads_a_hub_repo_too(fake_hub, store, hf_cache):
    out = CliRunner().invoke(main, ["show", "hf.co/testorg/Tiny-GGUF:Q8_0", "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    facts = json.loads(out.stdout)
    assert facts["name"] == "testorg/tiny-gguf:q8_0" and facts["architecture"] == "llama"
    assert facts["quantization"] == "Q8_0" and facts["files"][0]["path"].startswith(fake_hub.url)
    assert store.list() == [] and not list(hf_cache.rglob("*.gguf"))
