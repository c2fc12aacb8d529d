"""Each runtime's placement policy, keyed by runtime name like the runtime registry
(:data:`localrun.runtimes.REGISTRY`): what is particular to one runtime's placement lives in its
own module here, and the planner, the budget, ``plan``'s words, the manager and the activity log
ask :func:`policy_for` instead of testing a runtime's name.

To add a runtime's rules: write a :class:`~.base.DefaultPolicy` subclass in its own module,
overriding the hooks of :class:`~.base.PlacementPolicy` it needs, and list it in ``POLICIES``.
"""

from __future__ import annotations

from localrun.planning.policies.base import DefaultPolicy, Fit, PlacementPolicy, PlanJob, Slots, Tuning
from localrun.planning.policies.llamacpp import LlamaCppPolicy
from localrun.planning.policies.ollama import OllamaPolicy
from localrun.planning.policies.upstream import UpstreamPolicy
from localrun.planning.policies.vllm import VllmPolicy
from localrun.planning.policies.whole_device import MlcPolicy, MlxPolicy

__all__ = ["POLICIES", "Fit", "PlacementPolicy", "PlanJob", "Slots", "Tuning", "policy_for"]

#: The policy of the runtimes that need nothing special (the fake).
DEFAULT: PlacementPolicy = DefaultPolicy()

POLICIES: dict[str, PlacementPolicy] = {
    "llama.cpp": LlamaCppPolicy(),
    "fake": DEFAULT,
    "mlx": MlxPolicy(),
    "ollama": OllamaPolicy(),
    "mlc": MlcPolicy(),
    "vllm": VllmPolicy(),
    "upstream": UpstreamPolicy(),  # not a runtime of the registry: a plan for a model another server serves
}


def policy_for(runtime: str) -> PlacementPolicy:
    """The placement policy of ``runtime``; a name without rules of its own gets the default's."""
    return POLICIES.get(runtime, DEFAULT)
