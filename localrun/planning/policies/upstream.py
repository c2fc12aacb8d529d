"""An upstream's policy: another server serves the model and sets its context, so localrun
neither places it nor tells a user how to give it more context."""

from __future__ import annotations

from localrun.planning.policies.base import DefaultPolicy


class UpstreamPolicy(DefaultPolicy):
    """A model another server serves (``Plan(runtime="upstream")``): its own words stay."""

    hints_context = False
