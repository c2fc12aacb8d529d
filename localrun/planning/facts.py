"""What this machine has and which runtimes can run on it, detected once per process.

Each runtime knows how to probe itself (``Runtime.probe``: a missing extra, a llama.cpp
built without the GPU this machine has, an Ollama server that is not running…);
:func:`probe_runtimes` only asks every listed runtime of the registry in turn, so a new
runtime needs no line here. :func:`machine_facts` caches the hardware profile and those
statuses, which the planner reads (:func:`default_plan`) and ``localrun hw`` and the TUI
print (:func:`status_cells`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from localrun.planning.hardware import HardwareProfile
from localrun.runtimes import get_runtime, listed_runtimes
from localrun.runtimes.base import RuntimeStatus
from localrun.types import ModelRecord, Plan

log = logging.getLogger(__name__)


def probe_runtimes(hw: HardwareProfile, *, runtimes: Mapping[str, Any] | None = None) -> dict[str, RuntimeStatus]:
    """Every listed runtime's own ``probe(hw)``. Never raises: a failed probe is an unavailable status.

    ``runtimes`` (name → runtime) replaces the registry's, for tests that replay a machine.
    """
    statuses = {}
    for name in listed_runtimes() if runtimes is None else runtimes:
        try:
            runtime = get_runtime(name) if runtimes is None else runtimes[name]
            statuses[name] = runtime.probe(hw)
        except Exception as exc:  # noqa: BLE001 - a probe's own bug must not hide the other runtimes
            log.warning("probing %s failed: %s", name, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            statuses[name] = RuntimeStatus(name, False, reason=f"probe failed: {exc}")
    return statuses


_FACTS: dict[str, tuple[HardwareProfile, dict[str, RuntimeStatus]]] = {}
_FACTS_LOCK = threading.Lock()


def machine_facts(settings: Any = None, *, refresh: bool = False) -> tuple[HardwareProfile, dict[str, RuntimeStatus]]:
    """The hardware profile and runtime statuses, cached: detection is not free.

    Computed once under a lock and stored as one pair, so concurrent first callers
    (server threads, the TUI) never see half a cache. ``settings`` is accepted so callers
    hand over what they have; no probe needs it yet.
    """
    with _FACTS_LOCK:
        if refresh or "facts" not in _FACTS:
            from localrun.planning.hardware import detect_hardware

            hw = detect_hardware()
            _FACTS["facts"] = (hw, probe_runtimes(hw))
        return _FACTS["facts"]


def default_plan(record: ModelRecord, settings: Any, overrides: Any = None) -> Plan:
    """Plan with this machine's hardware and runtimes (detected once per process), the
    settings' forced runtime and the per-model overrides of the settings applied."""
    from localrun.planning.overrides import with_overrides
    from localrun.planning.planner import PlanOverrides, plan_placement

    if settings.runtime.force and (overrides is None or overrides.runtime is None):
        import dataclasses

        overrides = dataclasses.replace(overrides or PlanOverrides(), runtime=settings.runtime.force)
    hw, statuses = machine_facts(settings)
    plan = plan_placement(record, hw, statuses, overrides=overrides, settings=settings)
    return with_overrides(plan, record, settings)


def status_cells(status: RuntimeStatus) -> tuple[str, str, str]:
    """Version, devices and "why / how to get it" of a status, as ``localrun hw`` and the TUI show them."""
    why = " · ".join(x for x in (status.reason, status.fix) if x)
    return status.version or "—", ", ".join(status.devices) or "—", why


def backend_lines(statuses: Mapping[str, RuntimeStatus]) -> list[str]:
    """What ``localrun hw`` and the TUI say of the installed llama.cpp build: the backend it has next
    to the one this machine could use, and the devices llama.cpp itself sees (its own list, not NVML's)."""
    from localrun.planning.budget import build_words
    from localrun.planning.hardware import fmt_bytes

    st = statuses.get("llama.cpp")
    if st is None or not st.available or "backend" not in st.details:  # nothing probed, nothing to say
        return []
    has, could = st.details.get("backend", "cpu"), st.details.get("wanted_backend") or "cpu"
    line = build_words(has, could) + (f" (rebuild: {st.fix})" if has == "cpu" and could != "cpu" and st.fix else "")
    lines = [f"build     {line}"]
    for d in st.details.get("devices") or ():  # llama.cpp's own device list (the probe asks it)
        memory = f", {fmt_bytes(d['free'])} free of {fmt_bytes(d['total'])}" if d.get("total") else ""
        if d.get("type") == "cpu":  # llama.cpp's "free" for the CPU is not what is available: one RAM figure, above
            memory = ", the RAM above"
        lines.append(f"device    {d.get('name')}: {d.get('description')} ({d.get('type')}{memory})")
    return lines
