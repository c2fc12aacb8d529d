"""What drafting did is visible: per request in the usage (OpenAI's predicted-output fields
and a ``speculative`` extension), per model in /metrics, in the plan, the TUI and `run`."""

from __future__ import annotations

import httpx
import openai
import pytest

from localrun.server.metrics import Metrics, RequestStats
from localrun.server.openai.choices import usage_dict
from localrun.types import Usage
from tests.conftest import needs_llama
from tests.support.servers import free_port


def test_usage_shows_drafts_only_when_there_were_some():
    plain = usage_dict(Usage(5, 7, 0))
    assert "speculative" not in plain and "completion_tokens_details" not in plain
    u = usage_dict(Usage(5, 20, 0, drafted_tokens=12, accepted_tokens=9))
    assert u["speculative"] == {"drafted_tokens": 12, "accepted_tokens": 9}
    assert u["completion_tokens_details"] == {"accepted_prediction_tokens": 9, "rejected_prediction_tokens": 3}


def test_metrics_count_drafts_per_model():
    m = Metrics()
    m.observe_request(
        "/v1/completions", "POST", 200, 0.1, RequestStats(model="a", drafted_tokens=10, accepted_tokens=6)
    )
    m.observe_request(
        "/v1/completions", "POST", 200, 0.1, RequestStats(model="a", drafted_tokens=10, accepted_tokens=2)
    )
    m.observe_request("/v1/completions", "POST", 200, 0.1, RequestStats(model="b"))
    text = m.render(loaded=[], worker_restarts=0)
    assert 'localrun_speculative_drafted_tokens_total{model="a"} 20' in text
    assert 'localrun_speculative_accepted_tokens_total{model="a"} 8' in text
    assert 'localrun_speculative_acceptance_ratio{model="a"} 0.4000' in text
    assert 'model="b"' not in text.split("localrun_speculative_drafted_tokens_total")[-1].split("# HELP")[0]


def test_plan_says_what_drafting_will_do_and_rejects_unknown_modes():
    from localrun.errors import ConfigError
    from localrun.planning.speculation import speculation_plan

    mode, why = speculation_plan(None, 1)
    assert mode == "auto" and "auto (the default)" in why
    assert "only while that is faster" in speculation_plan("auto", 1)[1]
    assert "their share of each step" in speculation_plan("auto", 4)[1]
    assert speculation_plan("OFF", 1) == ("off", "speculative decoding off, as asked")
    with pytest.raises(ConfigError) as exc:
        speculation_plan("turbo", 1)
    assert exc.value.param == "speculative" and "ngram" in exc.value.hint


def test_tui_note_and_request_log_entry():
    from localrun.tui.server_view import speculation_note

    assert speculation_note(0, 0) == ""
    assert speculation_note(200, 150) == " · drafts 75 % kept, 150 tokens saved"


@needs_llama
@pytest.mark.llama
def test_a_real_server_reports_drafts_in_usage_and_metrics(spawn_server, tiny_gguf):
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

    ModelStore(Settings()).import_path(tiny_gguf, name="tiny")
    port = free_port()
    server = spawn_server(
        ["tests.support.launch", "--port", str(port)],
        port=port,
        env={"LOCALRUN_RUNTIME__FORCE": "", "LOCALRUN_RUNTIME__SPECULATIVE": "ngram"},
    )
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        got = oai.completions.create(model="tiny", prompt="hello world " * 5, max_tokens=40, temperature=0)
    extra = got.usage.model_extra["speculative"]
    assert extra["drafted_tokens"] > 0 and 0 < extra["accepted_tokens"] <= extra["drafted_tokens"]
    assert got.usage.completion_tokens_details.accepted_prediction_tokens == extra["accepted_tokens"]
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert f'localrun_speculative_drafted_tokens_total{{model="tiny"}} {extra["drafted_tokens"]}' in metrics
    assert f'localrun_speculative_accepted_tokens_total{{model="tiny"}} {extra["accepted_tokens"]}' in metrics


def test_the_planner_carries_the_setting_and_the_override_to_the_plan():
    from localrun.planning.planner import PlanOverrides, plan_placement
    from localrun.planning.render import render_plan
    from localrun.settings import Settings
    from tests.hardware.helpers import QWEN_05B, profile, record, statuses

    rec = record(QWEN_05B)
    default = plan_placement(rec, profile("cpu_laptop_8gb"), statuses("cpu"))
    assert default.options["speculative"] == "auto"
    assert "speculate guesses ahead from text seen before while that is faster (auto)" in render_plan(default, rec)
    auto = plan_placement(
        rec, profile("cpu_laptop_8gb"), statuses("cpu"), settings=Settings(runtime={"speculative": "auto"})
    )
    assert auto.options["speculative"] == "auto" and any(
        r.startswith("speculative decoding auto") for r in auto.reasons
    )
    assert "speculate guesses ahead from text seen before while that is faster (auto)" in render_plan(auto, rec)
    assert not any("exact_prefix" in line or "see why" in line for line in render_plan(auto, rec))  # plain words
    off = plan_placement(
        rec, profile("cpu_laptop_8gb"), statuses("cpu"), settings=Settings(runtime={"speculative": "off"})
    )
    assert off.options["speculative"] == "off"
    forced = plan_placement(
        rec,
        profile("cpu_laptop_8gb"),
        statuses("cpu"),
        settings=Settings(runtime={"speculative": "off"}),
        overrides=PlanOverrides(speculative="ngram"),
    )
    assert forced.options["speculative"] == "ngram"  # the flag beats the setting


@needs_llama
@pytest.mark.llama
def test_several_choices_sum_their_drafts_in_the_usage(tiny_gguf):
    from localrun.types import Cancel, CompletionRequest, Sampling
    from tests.batching.conftest import load
    from tests.speculative.conftest import TINY_PROMPTS

    spec = load(tiny_gguf, n_slots=4, slot_ctx=512, speculative="ngram")
    try:
        prompt = TINY_PROMPTS[0]

        def usage(n: int) -> Usage:
            req = CompletionRequest(prompt=prompt, sampling=Sampling(temperature=0.0, max_tokens=24, n=n))
            return [c for c in spec.complete(req, Cancel())][-1].usage

        one, three = usage(1), usage(3)
        assert one.drafted_tokens > 0, one  # the n-gram lookup drafts on this looping prompt
        # Greedy: every choice is the lone answer, drafted alike, and the request counts all three.
        assert three.completion_tokens == 3 * one.completion_tokens
        assert three.drafted_tokens == 3 * one.drafted_tokens and three.accepted_tokens == 3 * one.accepted_tokens
    finally:
        spec.close()
