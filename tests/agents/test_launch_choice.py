"""``launch`` without ``--model`` serves the registered model whose context holds the agent's first
request, and says which and why; ``--print codex`` declares an image model's images in the catalog
it writes (so ``codex exec -i`` keeps them) and leaves no temporary folder behind."""

from __future__ import annotations

import json
import shlex
import tempfile

from click.testing import CliRunner

from localrun.cli import main
from localrun.cli.launch import AGENTS
from localrun.cli.launch_kit import choose
from localrun.planning.planner import PlanOverrides
from localrun.settings import load_settings
from localrun.types import FileEntry, Format, ModelRecord
from tests.factories import write_tiny_llama_gguf

TOOLS = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{{ tools }}{% endif %}"


def _record(name: str, trained: int, template: str | None, size: int = 1_000_000) -> ModelRecord:
    meta = {"context_length": trained, "architecture": "llama"}
    if template:
        meta["chat_template"] = template
    path = f"/m/{name}.gguf"
    return ModelRecord(name, Format.GGUF, path, files=(FileEntry(path, size),), metadata=meta)


def test_the_model_that_holds_the_first_request_wins_and_says_why():
    settings = load_settings()
    agent = AGENTS["claude"]

    def sized(record):
        return PlanOverrides(n_ctx=agent.context, ctx_source="launch")

    short_chat = _record("smollm2-135m-instruct", 8192, TOOLS)  # the default chat model: 8k
    long_base = _record("gemma3-270m", 32768, None, size=253_000_000)
    choice = choose(settings, [short_chat, long_base], agent.first_request, sized)
    assert choice.record.name == "gemma3-270m" and choice.holds
    assert "holds claude's first request" in choice.why(agent.first_request, "claude")
    long_chat = _record("coder", 131072, TOOLS, size=50_000_000)
    choice = choose(settings, [short_chat, long_base, long_chat], agent.first_request, sized)
    assert choice.record.name == "coder" and choice.tools  # holding it, a model that takes tools beats a base model
    only_short = choose(settings, [short_chat], agent.first_request, sized)
    assert only_short.record.name == "smollm2-135m-instruct" and not only_short.holds
    assert "does not hold" in only_short.why(agent.first_request, "claude")


def test_codex_and_opencode_get_the_chat_model_their_measured_first_request_fits():
    """Codex's first request is 4,550 SmolLM2 tokens and opencode's 7,659: SmolLM2's 8,192 hold both
    with room for an answer, so neither gets the base Gemma, which rambles to the agent's cap."""
    settings = load_settings()
    short_chat = _record("smollm2-135m-instruct", 8192, TOOLS)
    long_base = _record("gemma3-270m", 32768, None, size=253_000_000)
    for name in ("codex", "opencode"):
        agent = AGENTS[name]

        def sized(record, agent=agent):
            return PlanOverrides(n_ctx=min(agent.context, record.metadata["context_length"]), ctx_source="launch")

        choice = choose(settings, [short_chat, long_base], agent.first_request, sized)
        assert choice.record.name == "smollm2-135m-instruct" and choice.holds, (
            name,
            choice.why(agent.first_request, name),
        )
    claude = AGENTS["claude"]
    choice = choose(
        settings,
        [short_chat, long_base],
        claude.first_request,
        lambda r: PlanOverrides(n_ctx=min(claude.context, r.metadata["context_length"]), ctx_source="launch"),
    )
    assert choice.record.name == "gemma3-270m"  # 20k tokens: only the long context holds Claude Code's


def test_print_codex_declares_images_for_a_model_that_sees_and_leaves_no_temp_folder(
    tmp_path, gemma3_tiny_projector, monkeypatch
):
    model = write_tiny_llama_gguf(tmp_path / "seer.gguf", n_embd=640)  # as wide as the projector's output
    runner = CliRunner()
    imported = runner.invoke(main, ["import", str(model), "--mmproj", str(gemma3_tiny_projector), "--name", "seer"])
    assert imported.exit_code == 0, imported.output
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    for _ in range(2):
        out = runner.invoke(main, ["launch", "--print", "codex", "--model", "seer"])
        assert out.exit_code == 0, out.output
    command = shlex.split(out.output.strip().splitlines()[-1])
    overrides = dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "-c")
    catalog = json.loads(open(json.loads(overrides["model_catalog_json"])).read())
    assert catalog["models"][0]["input_modalities"] == ["text", "image"]
    assert list(scratch.iterdir()) == []  # no localrun-codex-* folder per --print
