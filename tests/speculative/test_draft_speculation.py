"""Draft models in the scheduler, the plan and the CLI: greedy answers equal plain decoding's
with a draft model drafting (alone and batched, with stop strings and a grammar), the
plan finds a sibling draft and counts its memory, and a draft that cannot draft is
refused at load with a message that says why. The DraftModel class itself:
test_draft_model.py."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from localrun.errors import ConfigError, ModelNotFound
from localrun.planning.planner import PlanOverrides, plan_placement
from localrun.planning.render import render_plan
from localrun.settings import Settings
from localrun.types import Format, ModelRecord
from tests.batching.conftest import assert_idle, load, request, run, together
from tests.conftest import needs_llama
from tests.factories import write_tiny_llama_gguf
from tests.hardware.helpers import profile, statuses

PROMPTS = ["hello world " * 5, "zebra", "the time is now the time is", "a b c d e f g a b c"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A target, a smaller draft of the same vocabulary, an exact copy, and a stranger."""
    root = tmp_path_factory.mktemp("pair")
    target = write_tiny_llama_gguf(root / "model-Q8_0.gguf", seed=1)
    return {
        "target": target,
        "draft": write_tiny_llama_gguf(root / "model-DRAFT-Q4_0.gguf", seed=2, n_layer=1, n_ff=96),
        "copy": shutil.copy(target, root.parent / "copy-of-target.gguf"),
        "stranger": write_tiny_llama_gguf(
            root.parent / "stranger.gguf", seed=3, extra_tokens=("<|x|>",) * 0 + tuple(f"<|s{i}|>" for i in range(200))
        ),
    }


@needs_llama
@pytest.mark.llama
@pytest.mark.parametrize("which", ["draft", "copy"])
def test_greedy_answers_with_a_draft_model_equal_plain_decoding(pair, which):
    plain = load(pair["target"], n_slots=2, slot_ctx=256, speculative="off")
    spec = load(pair["target"], n_slots=2, slot_ctx=256, speculative="draft", draft=str(pair[which]))
    try:
        assert spec.speculative == "draft" and spec._sched.drafter is not None
        ref = [run(plain, request(p, max_tokens=40)) for p in PROMPTS]
        got = [run(spec, request(p, max_tokens=40)) for p in PROMPTS]
        assert [r.text for r in got] == [r.text for r in ref]
        assert [r.finish for r in got] == [r.finish for r in ref]
        drafted = sum(r.usage.drafted_tokens for r in got)
        accepted = sum(r.usage.accepted_tokens for r in got)
        assert drafted > 0
        if which == "copy":  # the target's own greedy guesses: every drafted token is kept
            assert accepted == drafted
        else:
            assert accepted < drafted
        batched = together(spec, [request(p, max_tokens=40) for p in PROMPTS + PROMPTS[:2]])  # 6 on 2 slots
        assert [r.text for r in batched] == [r.text for r in ref + ref[:2]]
        assert_idle(spec)
        # a stop string in the middle of a draft, and a grammar that cuts drafts
        stop = ref[0].text[10:13]
        cut = run(spec, request(PROMPTS[0], max_tokens=40, stop=(stop,)))
        assert cut == run(plain, request(PROMPTS[0], max_tokens=40, stop=(stop,))) or (cut.text, cut.finish) == (
            ref[0].text[: ref[0].text.index(stop)],
            "stop",
        )
        grammar = 'root ::= ("hello" | " world" | " the" | " time" | " is")+'
        assert (
            run(spec, request(PROMPTS[0], max_tokens=24, grammar=grammar)).text
            == run(plain, request(PROMPTS[0], max_tokens=24, grammar=grammar)).text
        )
    finally:
        plain.close()
        spec.close()


@needs_llama
@pytest.mark.llama
def test_auto_with_a_draft_model_keeps_the_answer_and_drafts_where_it_pays(pair):
    plain = load(pair["target"], n_slots=1, slot_ctx=256, speculative="off")
    auto = load(pair["target"], n_slots=1, slot_ctx=256, speculative="auto", draft=str(pair["copy"]))
    try:
        assert auto._sched.drafter is not None
        for p in PROMPTS:
            assert run(auto, request(p, max_tokens=48)).text == run(plain, request(p, max_tokens=48)).text
        # an exact copy is always right: its drafts must have been tried and kept
        totals = auto._sched.spec_totals
        assert totals.accepted > 0 and auto._sched.costs.draft_step is not None
    finally:
        plain.close()
        auto.close()


@needs_llama
@pytest.mark.llama
def test_a_draft_with_another_vocabulary_is_refused_at_load(pair):
    with pytest.raises(ConfigError) as exc:
        load(pair["target"], n_slots=1, slot_ctx=128, speculative="draft", draft=str(pair["stranger"]))
    assert "stranger.gguf" in str(exc.value) and "vocabulary" in str(exc.value) and exc.value.param == "draft"
    # the target still loads and answers afterwards: nothing was left half-made
    s = load(pair["target"], n_slots=1, slot_ctx=128, speculative="off")
    try:
        assert run(s, request("zebra", max_tokens=4)).usage.completion_tokens == 4
    finally:
        s.close()


def test_draft_mode_without_a_draft_model_is_a_clear_error():
    from localrun.runtimes.llamacpp.speculative.drafting import speculation
    from localrun.types import Plan

    with pytest.raises(ConfigError, match="needs a draft model") as exc:
        speculation(Plan(runtime="llama.cpp", options={"speculative": "draft"}), 0)
    assert "--draft" in exc.value.hint


def _record(path) -> ModelRecord:
    from localrun.modelstore.store import ModelStore

    return ModelStore(Settings()).inspect_path(str(path))


def test_the_plan_finds_a_sibling_draft_and_counts_its_memory(pair):
    rec = _record(pair["target"])
    hw, st = profile("cpu_laptop_8gb"), statuses("cpu")
    auto = plan_placement(rec, hw, st, overrides=PlanOverrides(speculative="auto"))
    assert auto.options["draft"].endswith("model-DRAFT-Q4_0.gguf")
    assert any("draft model model-DRAFT-Q4_0.gguf (found beside the model" in r for r in auto.reasons)
    none = plan_placement(rec, hw, st, overrides=PlanOverrides(speculative="auto", draft="none"))
    assert "draft" not in none.options
    assert auto.options["placement"]["host_bytes"] > none.options["placement"]["host_bytes"]
    lines = render_plan(auto, rec)
    assert any("draft" in line for line in lines)
    # off and ngram modes load no draft model, whatever is beside the file
    assert "draft" not in plan_placement(rec, hw, st, overrides=PlanOverrides(speculative="ngram")).options
    # asked by path, and refused: missing, the model itself, draft mode with drafts turned off
    asked = plan_placement(rec, hw, st, overrides=PlanOverrides(speculative="draft", draft=str(pair["copy"])))
    assert asked.options["draft"] == str(pair["copy"]) and any("as asked" in r for r in asked.reasons)
    with pytest.raises(ModelNotFound):
        plan_placement(rec, hw, st, overrides=PlanOverrides(speculative="draft", draft="/nowhere/none.gguf"))
    with pytest.raises(ConfigError, match="the model itself"):
        plan_placement(rec, hw, st, overrides=PlanOverrides(speculative="draft", draft=str(pair["target"])))
    with pytest.raises(ConfigError, match="turned off"):
        plan_placement(rec, hw, st, overrides=PlanOverrides(speculative="draft", draft="none"))


def test_draft_mode_for_a_model_with_no_draft_beside_it(pair):
    rec = _record(pair["copy"])  # alone in its folder but for the stranger, whose name says no "draft"
    with pytest.raises(ConfigError, match="has none beside it"):
        plan_placement(rec, profile("cpu_laptop_8gb"), statuses("cpu"), overrides=PlanOverrides(speculative="draft"))
    assert (
        "draft"
        not in plan_placement(
            rec, profile("cpu_laptop_8gb"), statuses("cpu"), overrides=PlanOverrides(speculative="auto")
        ).options
    )


def test_a_draft_model_from_the_store_by_name(pair):
    from localrun.modelstore.store import ModelStore

    ModelStore(Settings()).import_path(pair["draft"], name="tiny-draft")
    rec = _record(pair["copy"])
    plan = plan_placement(
        rec,
        profile("cpu_laptop_8gb"),
        statuses("cpu"),
        settings=Settings(runtime={"draft": "tiny-draft", "speculative": "draft"}),
    )
    assert plan.options["draft"].endswith(".gguf") and plan.options["speculative"] == "draft"


def test_cli_plan_takes_draft_and_says_what_it_loads(pair):
    from localrun.cli import main

    got = CliRunner().invoke(
        main, ["plan", str(pair["target"]), "--speculative", "draft", "--draft", str(pair["copy"])]
    )
    assert got.exit_code == 0, got.output
    assert "copy-of-target.gguf" in got.output
    bad = CliRunner().invoke(main, ["plan", str(pair["copy"]), "--speculative", "draft"])
    assert bad.exit_code != 0 and "draft" in bad.output


def test_a_record_that_is_not_gguf_gets_no_draft(pair):
    from localrun.planning.speculation import draft_plan

    mlx = ModelRecord(name="m", format=Format.MLX, path=str(pair["target"]))
    assert draft_plan(mlx, "auto", None, Settings(), n_ctx=256) is None


def test_the_default_plan_loads_a_sibling_draft(pair):
    """auto is the default: a plan with no speculative setting finds the draft beside the model."""
    rec = _record(pair["target"])
    plan = plan_placement(rec, profile("cpu_laptop_8gb"), statuses("cpu"))
    assert plan.options["speculative"] == "auto" and plan.options["draft"].endswith("model-DRAFT-Q4_0.gguf")
