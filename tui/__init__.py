"""The localrun TUI (``localrun tui``): a Textual app over the same store and ModelManager
the embedded server serves. Build it with :func:`make_app`."""

from __future__ import annotations

from localrun.tui.factory import make_app

__all__ = ["make_app"]
