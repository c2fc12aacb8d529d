"""Column widths are right in the handler that fills a table, before the table's idle pass
(a repaint between the two used to cache cells cut at header widths, seen under load)."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from localrun.tui.tables import fit_columns

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class _TableApp(App):
    def compose(self) -> ComposeResult:
        yield DataTable()


def _widths(table: DataTable) -> list[int]:
    return [c.content_width for c in table.ordered_columns]


async def test_fit_columns_measures_now_and_lets_columns_shrink():
    app = _TableApp()
    async with app.run_test() as pilot:
        table = app.query_one(DataTable)
        table.add_columns("Quant", "File", "Fit")
        await pilot.pause()
        table.add_row(Text("Q4_K_M"), "tiny-model-q4_k_m.gguf", Text("● fits (1.0 GB with 4k)"), key="a")
        table.add_row("F16", Text("x"), "—", key="b")
        # no await: the table has had no idle since the rows arrived
        fit_columns(table)
        assert _widths(table) == [6, len("tiny-model-q4_k_m.gguf"), len("● fits (1.0 GB with 4k)")]

        table.clear()
        table.add_row("Q8_0", "small.gguf", "ok", key="c")
        fit_columns(table)
        assert _widths(table) == [len("Quant"), len("small.gguf"), len("Fit")]

        # an append-only log measures only the rows it names, and only grows
        table.add_row("IQ4_XS_LONGER", "s", "s", key="d")
        fit_columns(table, ["d", "missing"])
        assert _widths(table) == [len("IQ4_XS_LONGER"), len("small.gguf"), len("Fit")]

        await pilot.pause()
        assert _widths(table) == [len("IQ4_XS_LONGER"), len("small.gguf"), len("Fit")]  # the idle pass agrees
        assert table.virtual_size.width >= sum(_widths(table))
