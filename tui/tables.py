"""Column widths measured when a table is filled, not on the table's next idle.

Textual's ``DataTable`` measures new rows when its own message queue next runs dry. A
repaint that lands first (the screen's, under load) renders the cells at the old widths
and caches them under a key the later measurement does not change, so the columns stay
cut at their header widths ("Q4_K_" for "Q4_K_M") until the next edit. Measuring in the
handler that filled the table makes the first paint right; the table's own pass then
agrees with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from rich.measure import Measurement
from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import RowKey

if TYPE_CHECKING:
    from rich.console import Console, RenderableType


def _width(console: Console, cell: object) -> int:
    renderable = Text(cell) if isinstance(cell, str) else cell
    if not hasattr(renderable, "__rich_measure__") and not hasattr(renderable, "__rich_console__"):
        renderable = Text(str(renderable))
    return Measurement.get(console, console.options, cast("RenderableType", renderable)).maximum


def fit_columns(
    table: DataTable[Any], rows: Iterable[RowKey | str] | None = None, columns: Iterable[str] | None = None
) -> None:
    """Size the auto-width columns to their widest cell and header.

    With ``rows=None`` every row is measured and a column may shrink (a new search holds
    shorter names); with ``rows`` given only those are measured and columns only grow,
    which keeps an append-only log and a poll tick cheap; ``columns`` limits the work to
    the columns that changed. The table is laid out again only when a width changed.
    """
    console = table.app.console
    keys = list(table.rows) if rows is None else [k for k in rows if k in table.rows]
    wanted = None if columns is None else set(columns)
    changed = False
    for column in table.ordered_columns:
        if not column.auto_width or (wanted is not None and column.key.value not in wanted):
            continue
        widest = _width(console, column.label) if rows is None else column.content_width
        for key in keys:
            widest = max(widest, _width(console, table.get_cell(key, column.key)))
        changed = changed or widest != column.content_width
        column.content_width = widest
    if changed:
        table.refresh(layout=True)
