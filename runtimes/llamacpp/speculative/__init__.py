"""Speculative decoding inside the scheduler.

* :mod:`.drafting` — n-gram drafts, the policy that decides when a draft pays, the modes.
* :mod:`.draft_model` — drafts from a small second model.
* :mod:`.step` — one verification pass: draft, verify, keep the agreeing prefix.
* :mod:`.pass_costs` — what a pass of m rows costs against a plain step, measured here.
"""
