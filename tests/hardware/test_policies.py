"""The placement policies: one per runtime, keyed like the runtime registry, and the planner
asks them (a runtime's name decides nothing in the planner itself)."""

from __future__ import annotations

import pytest

from localrun.planning import policies
from localrun.planning.planner import PlanOverrides, plan_placement
from localrun.planning.policies import POLICIES, policy_for
from localrun.planning.policies.base import DefaultPolicy
from localrun.planning.policies.llamacpp import LlamaCppPolicy
from localrun.planning.render import render_plan
from localrun.runtimes import REGISTRY
from tests.hardware.helpers import QWEN_05B, profile, record, statuses


def test_every_runtime_of_the_registry_has_a_policy():
    assert set(REGISTRY) <= set(POLICIES)
    assert all(policy_for(name) is POLICIES[name] for name in REGISTRY)


def test_a_name_without_rules_gets_the_default_and_an_upstream_keeps_its_own_words():
    assert policy_for("no-such-runtime") is policies.DEFAULT
    assert type(policy_for("no-such-runtime")) is DefaultPolicy
    assert not policy_for("upstream").hints_context and policy_for("llama.cpp").hints_context
    assert policy_for("llama.cpp").takes_cache_options and not policy_for("ollama").takes_cache_options


@pytest.mark.parametrize(("rules", "slots"), [(None, False), (LlamaCppPolicy(), True)])
def test_the_planner_asks_the_policy_not_the_name(monkeypatch, rules, slots):
    """The fake planned under llama.cpp's rules gets llama.cpp's slots and words, so the rules
    live in the policy and nowhere else."""
    if rules is not None:
        monkeypatch.setitem(POLICIES, "fake", rules)
    rec = record(QWEN_05B)
    plan = plan_placement(rec, profile("cpu_laptop_8gb"), statuses("cpu"), overrides=PlanOverrides(runtime="fake"))
    assert plan.runtime == "fake"
    assert ("n_slots" in plan.options) is slots and ("speculative" in plan.options) is slots
    assert any(line.startswith("parallel  ") for line in render_plan(plan, rec)) is slots
