"""What on a rendered screen is cut: words of a label that never reach the screen, a footer
key whose words are not whole, an input or a select whose text is wider than its box.

Read from the composited screen (what a terminal shows), compared with the texts the
widgets hold, so a wording change never needs the test changed."""

from __future__ import annotations

import re

from textual.containers import ScrollableContainer
from textual.widgets import DataTable, Footer, Input, Label, Select, Static

from tests.tui.conftest import screen_text

_WORD = re.compile(r"[A-Za-z0-9][\w.:/'’()\-]*")


def _words(text: str) -> list[str]:
    return [w.strip(".,:;()'’") for w in _WORD.findall(text) if w.strip(".,:;()'’")]


def _region_text(lines: list[str], region) -> str:
    return "\n".join(line[region.x : region.right] for line in lines[region.y : region.bottom])


def _scrolls(widget) -> bool:
    """Inside a container that scrolls: text below the fold is reached by scrolling, not cut."""
    return any(isinstance(a, ScrollableContainer) for a in widget.ancestors)


def cut_texts(app) -> list[str]:
    """Every text on the current screen that does not show whole, as ``widget: what is missing``."""
    screen = app.screen
    lines = screen_text(app).splitlines()
    problems: list[str] = []
    for widget in screen.query("*"):
        if not widget.display or not widget.visible or widget.region.area == 0:
            continue
        name = f"{type(widget).__name__}#{widget.id}"
        if isinstance(widget, Input):
            text = widget.value or widget.placeholder
            if len(text) > widget.content_region.width:
                problems.append(f"{name}: {text!r} is wider than its box ({widget.content_region.width})")
        elif isinstance(widget, Select):
            value = widget.value
            if isinstance(value, str) and len(value) + 2 > widget.content_region.width:
                problems.append(f"{name}: {value!r} is wider than its box ({widget.content_region.width})")
        elif isinstance(widget, Static | Label) and not isinstance(widget, DataTable) and not _scrolls(widget):
            text = str(widget.render())
            shown = _region_text(lines, widget.region)
            seen = set(_words(shown))
            missing = [w for w in _words(text) if w not in seen]
            if missing:
                problems.append(f"{name}: {missing[:6]} not on screen (shows {shown!r})")
    for footer in screen.query(Footer):
        row = _region_text(lines, footer.region)
        for binding in {b.binding.description for b in screen.active_bindings.values() if b.binding.show}:
            if binding and binding not in row:
                problems.append(f"footer: {binding!r} not whole in {row!r}")
    return problems
