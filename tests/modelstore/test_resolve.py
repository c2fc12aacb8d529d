"""Every spelling of one model finds it, at the store's one door (issue 33, "names that resolve")."""

from __future__ import annotations

import dataclasses

import pytest

from localrun.errors import ModelNotFound
from localrun.modelstore.resolve import nearest
from localrun.modelstore.store import ModelStore
from localrun.settings import load_settings
from localrun.types import Source
from tests.hub import repos


@pytest.fixture
def store():
    return ModelStore(load_settings())


@pytest.fixture
def pulled(store, tmp_path):
    """What `pull acme/x-GGUF` registers (two quants), without the network: name lowercased, repo as typed."""

    def add(quant: str, seed: int):
        path = tmp_path / f"X-{quant}.gguf"
        path.write_bytes(repos.make_gguf(quant=quant, seed=seed))
        rec = store.inspect_path(path, name=f"acme/x-gguf:{quant.lower()}")
        return store.register(dataclasses.replace(rec, repo="acme/x-GGUF", source=Source.HUB))

    return add("Q4_K_M", 1), add("Q8_0", 2)


@pytest.mark.parametrize(
    "typed",
    [
        "acme/x-GGUF",
        "acme/x-gguf",
        "ACME/X-GGUF:Q4_K_M",
        "acme/x-GGUF:q4_k_m",
        "hf.co/acme/x-GGUF:Q4_K_M",
        "hf.co/acme/x-GGUF",
        "hf.co/acme/x-GGUF:latest",
        "huggingface.co/acme/x-GGUF:Q4_K_M",
        "https://huggingface.co/acme/x-GGUF",
        "acme/x-GGUF/X-Q4_K_M.gguf",
    ],
)
def test_repo_reference_finds_what_was_pulled(store, pulled, typed):
    assert store.resolve(typed).name == "acme/x-gguf:q4_k_m"


def test_reference_with_quant_picks_that_quant(store, pulled):
    assert store.resolve("hf.co/acme/x-GGUF:Q8_0").name == "acme/x-gguf:q8_0"
    with pytest.raises(ModelNotFound, match="did you mean"):
        store.resolve("acme/x-GGUF:Q5_K_M")


def test_several_quants_and_no_default_is_a_question(store, tmp_path):
    for quant, seed in (("Q5_K_M", 3), ("Q6_K", 4)):
        path = tmp_path / f"Y-{quant}.gguf"
        path.write_bytes(repos.make_gguf(quant=quant, seed=seed))
        rec = store.inspect_path(path, name=f"acme/y-gguf:{quant.lower()}")
        store.register(dataclasses.replace(rec, repo="acme/y-GGUF", source=Source.HUB))
    with pytest.raises(ModelNotFound, match=r"names 2 models: acme/y-gguf:q5_k_m, acme/y-gguf:q6_k"):
        store.resolve("acme/y-GGUF")


def test_latest_is_the_bare_name_both_ways(store, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(repos.make_gguf(seed=5))
    store.import_path(path, name="gemma")
    store.import_path(path, name="other:latest")
    assert store.resolve("gemma:latest").name == "gemma"
    assert store.resolve("GEMMA:Latest").name == "gemma"
    assert store.resolve("other").name == "other:latest"


def test_a_typo_gets_the_nearest_name(store):
    with pytest.raises(ModelNotFound) as err:
        store.resolve("gemmma")
    assert "did you mean gemma3-270m" in err.value.message
    assert nearest("smolm2", ["smollm2-135m-instruct", "gemma3-270m"]) == ["smollm2-135m-instruct"]
    assert nearest("zzzz", ["gemma3-270m"]) == []


def _lmstudio(home):
    repo = home / ".lmstudio" / "models" / "lmstudio-community" / "Tiny-GGUF"
    repo.mkdir(parents=True)
    (repo / "Tiny-Q4_K_M.gguf").write_bytes(repos.make_gguf(seed=41))
    (repo / "Tiny-Q8_0.gguf").write_bytes(repos.make_gguf(quant="Q8_0", seed=42))
    return repo


def test_every_name_ls_all_prints_resolves(store, monkeypatch, tmp_path):
    from localrun.modelstore.sources import discover_all

    monkeypatch.setenv("HOME", str(tmp_path))
    repo = _lmstudio(tmp_path)
    listed = discover_all()
    assert {r.name for r in listed} == {"lmstudio-community/tiny-gguf:q4_k_m", "lmstudio-community/tiny-gguf:q8_0"}
    for record in listed:
        found = store.resolve(record.name)
        assert found.path == record.path and found.source is Source.LMSTUDIO
    assert store.resolve("lmstudio-community/Tiny-GGUF").path == str(repo / "Tiny-Q4_K_M.gguf")
    assert store.resolve("hf.co/lmstudio-community/Tiny-GGUF:Q8_0").path == str(repo / "Tiny-Q8_0.gguf")
    assert store.list() == []  # used in place, never registered behind the user's back


def test_rm_of_another_apps_model_says_whose_it_is(store, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    repo = _lmstudio(tmp_path)
    with pytest.raises(ModelNotFound, match="not registered with localrun: it is lmstudio's"):
        store.remove("lmstudio-community/tiny-gguf:q4_k_m")
    assert (repo / "Tiny-Q4_K_M.gguf").exists()


def test_rm_takes_every_spelling(store, pulled):
    assert store.remove("hf.co/acme/x-GGUF:Q8_0").name == "acme/x-gguf:q8_0"
    with pytest.raises(ModelNotFound, match="did you mean acme/x-gguf:q4_k_m"):
        store.remove("acme/x-gguf:q8_0")
