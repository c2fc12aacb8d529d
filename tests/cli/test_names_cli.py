"""Names as a person types them in the CLI: a typo's suggestion, repo references in run/plan/show,
`ps` naming models as `ls` does, `stop` and `show` (issue 33)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import httpx
import pytest
from click.testing import CliRunner

from localrun.cli import main
from localrun.types import Source
from tests.hub import repos


def cli(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


@pytest.fixture
def pulled(tmp_path):
    """What `pull acme/x-GGUF` registers, without the network."""
    from localrun.modelstore.store import ModelStore
    from localrun.settings import load_settings

    store = ModelStore(load_settings())
    path = tmp_path / "X-Q4_K_M.gguf"
    path.write_bytes(repos.make_gguf(seed=1))
    rec = store.inspect_path(path, name="acme/x-gguf:q4_k_m")
    return store.register(dataclasses.replace(rec, repo="acme/x-GGUF", source=Source.HUB))


def test_a_typo_suggests_the_nearest_name():
    out = cli("run", "gemmma", "hi")
    assert out.exit_code == 3
    assert "did you mean gemma3-270m" in out.output


@pytest.mark.parametrize("typed", ["acme/x-GGUF", "hf.co/acme/x-GGUF:Q4_K_M", "huggingface.co/acme/x-gguf"])
def test_plan_and_show_take_a_repo_reference(pulled, typed):
    planned = cli("plan", typed, "--json", "--runtime", "fake")
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["model"] == "acme/x-gguf:q4_k_m"
    shown = cli("show", typed, "--json")
    assert shown.exit_code == 0, shown.output
    facts = json.loads(shown.output)
    assert facts["name"] == "acme/x-gguf:q4_k_m" and facts["quantization"] == "Q4_K_M"
    assert facts["architecture"] == "llama" and facts["files"][0]["path"] == pulled.path


def test_show_in_words(tiny_gguf):
    assert cli("import", str(tiny_gguf), "--name", "tiny").exit_code == 0
    out = cli("show", "tiny")
    assert out.exit_code == 0, out.output
    for line in ("architecture", "llama", "context length", "Capabilities", "completion", "Files", "Template"):
        assert line in out.output
    assert cli("show", "tiny", "--template").output.strip().startswith("{%")
    missing = cli("show", "tinny")
    assert missing.exit_code == 3 and "did you mean tiny" in missing.output


def test_ls_does_not_cut_names_at_80_columns(pulled, tiny_gguf):
    long = "bartowski/llama-3.2-1b-instruct-gguf:q4_k_m"
    assert cli("import", str(tiny_gguf), "--name", long).exit_code == 0
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run([sys.executable, "-m", "localrun", "ls"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "acme/x-gguf:q4_k_m" in out.stdout and long in out.stdout, out.stdout
    assert "…" not in out.stdout and "Q4_K_M" in out.stdout and "completion" in out.stdout, out.stdout
    assert all(len(line) <= 80 for line in out.stdout.splitlines()), out.stdout


def test_ps_names_models_as_ls_does_and_stop_unloads(live):
    env = {"LOCALRUN_SERVER__PORT": live.url.rsplit(":", 1)[1]}
    loaded = httpx.post(live.url + "/api/generate", json={"model": "tiny:latest"}, timeout=30)
    assert loaded.status_code == 200, loaded.text
    ps = cli("ps", env=env)
    assert ps.exit_code == 0 and "tiny" in ps.output and "tiny:latest" not in ps.output, ps.output
    stopped = cli("stop", "tiny:latest", env=env)
    assert stopped.exit_code == 0 and "stopped tiny" in stopped.output, stopped.output
    assert not live.stack.manager.is_loaded("tiny")
    again = cli("stop", "tiny", env=env)
    assert again.exit_code == 1 and "not loaded: tiny" in again.output
    typo = cli("stop", "tinny", env=env)
    assert typo.exit_code == 3 and "did you mean tiny" in typo.output, typo.output
    httpx.post(live.url + "/api/generate", json={"model": "tiny"}, timeout=30)
    assert cli("stop", "--all", env=env).exit_code == 0
    assert not live.stack.manager.is_loaded("tiny")


def test_every_name_ls_all_prints_works_in_run_plan_show(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    repo = tmp_path / ".lmstudio" / "models" / "lmstudio-community" / "Tiny-GGUF"
    repo.mkdir(parents=True)
    (repo / "Tiny-Q4_K_M.gguf").write_bytes(repos.make_gguf(seed=41))
    listed = json.loads(cli("ls", "--all", "--json").stdout)
    names = [r["name"] for r in listed if r.get("registered") is False]
    assert names == ["lmstudio-community/tiny-gguf:q4_k_m"]
    for name in [*names, "lmstudio-community/Tiny-GGUF", "hf.co/lmstudio-community/Tiny-GGUF:Q4_K_M"]:
        ran = cli("run", name, "hi", "--runtime", "fake", "--max-tokens", "3")
        assert ran.exit_code == 0, ran.output
        assert cli("plan", name, "--runtime", "fake").exit_code == 0
        assert json.loads(cli("show", name, "--json").stdout)["source"] == "lmstudio"
    gone = cli("rm", names[0])
    assert gone.exit_code == 3 and "localrun never deletes another app's files" in gone.output
    assert (repo / "Tiny-Q4_K_M.gguf").exists()
