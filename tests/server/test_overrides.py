"""Per-model overrides: pooling and the chat template, from ``localrun import`` flags,
config.toml and ``serve --pooling``; shown by ``localrun plan`` and /props; and honoured by
a real llama.cpp server (a model with no pooling embeds; the override template renders)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import openai
import pytest

from tests.conftest import needs_llama

TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt "
    "%}[assistant] {% endif %}"
)


def lr(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "localrun", *args], capture_output=True, text=True, timeout=120, env=os.environ.copy()
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"localrun {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_precedence_import_then_config_star_then_config_name(tiny_gguf):
    import dataclasses

    from localrun.modelstore.store import ModelStore
    from localrun.planning.overrides import META_POOLING, model_overrides
    from localrun.settings import Settings

    record = ModelStore(Settings()).import_path(tiny_gguf, name="tiny")
    assert model_overrides(record, Settings()) == ({}, [])
    record = dataclasses.replace(record, metadata={**record.metadata, META_POOLING: "cls"})
    assert model_overrides(record, Settings())[0] == {"pooling": "cls"}
    assert model_overrides(record, Settings(models={"*": {"pooling": "last"}}))[0] == {"pooling": "last"}
    both = Settings(models={"*": {"pooling": "last"}, "tiny": {"pooling": "mean"}})
    options, reasons = model_overrides(record, both)
    assert options == {"pooling": "mean"} and reasons == ["embeddings pool by mean (override)"]
    with pytest.raises(Exception, match="pooling"):
        Settings(models={"tiny": {"pooling": "max"}})


def test_import_flags_are_recorded_and_shown_by_plan(tiny_gguf, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    lr("import", str(tiny_gguf), "--name", "tiny", "--pooling", "mean", "--chat-template", str(template))
    plan = " ".join(lr("plan", "tiny").stdout.split())  # rich wraps long lines
    assert "embeddings pool by mean (override)" in plan and f"chat template from {template} (override)" in plan
    options = json.loads(lr("plan", "tiny", "--json").stdout)["plan"]["options"]
    assert options["pooling"] == "mean" and options["chat_template"] == TEMPLATE
    lr("import", str(tiny_gguf), "--name", "tiny", "--pooling", "cls")  # the same file again: updated in place
    assert json.loads(lr("plan", "tiny", "--json").stdout)["plan"]["options"]["pooling"] == "cls"


def test_a_bad_template_is_refused_at_import(tiny_gguf, tmp_path):
    bomb = tmp_path / "bad.jinja"
    bomb.write_text("{% for x in range(10**9) %}{% for y in range(10**9) %}x{% endfor %}{% endfor %}")
    out = lr("import", str(tiny_gguf), "--name", "tiny", "--chat-template", str(bomb), check=False)
    assert out.returncode == 2 and "bad.jinja" in out.stderr
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    out = lr("import", str(tiny_gguf), "--name", "tiny", "--chat-template", str(broken), check=False)
    assert out.returncode == 2 and "does not render" in " ".join(out.stderr.split())
    assert json.loads(lr("ls", "--json").stdout) == []  # nothing registered
    out = lr("import", str(tiny_gguf), "--pooling", "max", check=False)
    assert out.returncode != 0 and "max" in out.stderr


@needs_llama
@pytest.mark.llama
def test_config_overrides_reach_a_real_server(serve_module, tiny_gguf, tmp_path):
    """A decoder without pooling embeds under [models."*"] pooling = "mean"; the template file
    replaces the GGUF's, in /props and in the prompt."""
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    models = {"*": {"pooling": "mean"}, "tiny": {"chat_template_file": str(template)}}
    server = serve_module(tiny_gguf, plan={"n_threads": 1}, env={"LOCALRUN_MODELS": json.dumps(models)})
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        r = oai.embeddings.create(model="tiny", input="hello world")
        assert len(r.data[0].embedding) == 64 and r.usage.prompt_tokens == 3
    props = httpx.get(f"{server.url}/props").json()
    assert (
        props["chat_template"] == TEMPLATE
        and props["chat_template_source"] == "override"
        and props["pooling"] == "mean"
    )
    prompt = httpx.post(f"{server.url}/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert prompt == {"prompt": "[user] hi\n[assistant] "}
