"""Small formatters the screens share: sizes, durations, rates, fit badges.

Pure functions of plain data, so they are tested without an app. Badges are Rich
``Text`` coloured from the running theme's variables, so light and dark themes both read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from rich.text import Text

from localrun.planning.hardware import human_bytes as human_bytes  # the one byte formatter (re-exported)

log = logging.getLogger(__name__)

#: Marks for the planner's verdicts, read at a glance and without colour.
VERDICT_MARKS: dict[str, tuple[str, str, str]] = {
    "fits": ("●", "fits", "success"),
    "tight": ("◐", "tight", "warning"),
    "wont-fit": ("✕", "won't fit", "error"),
}


def cache_cell(cache: dict[str, Any] | None, tier: str) -> str:
    """One tier of a model's prompt cache as ``ps`` shows it: prefixes, tokens, bytes ("-": no cache).

    RAM counts the slots that hold a prefix and the host-RAM entries; its bytes are the host
    entries' (the slots' KV is the context's own, allocated at load)."""
    if not cache:
        return "-"
    if tier == "ram":
        entries = int(cache.get("host_entries", 0)) + int(cache.get("slots_held", 0))
        tokens = int(cache.get("slot_tokens", 0)) + int(cache.get("host_tokens", 0))
        size = int(cache.get("host_bytes", 0))
    else:
        entries, tokens, size = (int(cache.get(f"disk_{k}", 0)) for k in ("entries", "tokens", "bytes"))
    return f"{entries} · {tokens} tok · {human_bytes(size)}"


def human_duration(seconds: float | None) -> str:
    """``12 s``, ``4:48``, ``1:02:03``; ``—`` for unknown, ``∞`` for never."""
    if seconds is None:
        return "—"
    if seconds == float("inf"):
        return "∞"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def human_rate(bytes_per_s: float | None) -> str:
    if not bytes_per_s:
        return "—"
    return human_bytes(bytes_per_s) + "/s"


def human_count(n: int | None) -> str:
    """Hub-style counts: ``310``, ``12.4 k``, ``1.2 M``."""
    if n is None:
        return "—"
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f} M"
    if n >= 10_000:
        return f"{n / 1000:.1f} k"
    return f"{n:,}"


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def eta(done: int, total: int | None, rate: float | None) -> str:
    """Time left for a transfer, or ``—`` when the rate or size is unknown."""
    if not total or not rate or done >= total:
        return "—"
    return human_duration((total - done) / rate)


def progress_bar(fraction: float, width: int = 18) -> str:
    fraction = min(1.0, max(0.0, fraction))
    full = int(round(fraction * width))
    return "█" * full + "░" * (width - full)


def verdict_badge(verdict: str | None, theme: Mapping[str, str] | None = None, *, detail: str | None = None) -> Text:
    """A fit badge: mark + words (+ a detail such as "no Metal"), coloured by the theme."""
    if not verdict:
        return Text("…", style="dim")
    mark, words, var = VERDICT_MARKS.get(verdict, ("?", verdict, "foreground"))
    label = f"{mark} {detail or words}"
    colour = (theme or {}).get(var)
    return Text(label, style=colour or "")


def sparkline_peak(samples: list[float]) -> str:
    return f"peak {max(samples):.1f}" if samples and max(samples) > 0 else "idle"
