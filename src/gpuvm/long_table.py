"""A rich Table that prints thousands of plain rows in milliseconds, exactly as rich prints them.

rich measures, wraps and pads every cell as a renderable of its own: ~1 ms a cell here, 13 s for
`gpuvm inventory`'s 4,096 VMs. When every cell is one line of printable ASCII that rich would print
as it is, and the table fits the width, each row is only its cells padded to their column's width
between the box's bars. rich then renders the table with two rows of each column's widest cell
(title, header, borders, widths: all rich's), and the rows in between are written here; if that
rendering's rows are not the line this module writes for them (another box, styles, a column width
rich chose otherwise), or any cell is not plain, rich renders the whole table as usual.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.table import Row, Table

_PLAIN = re.compile(r"(?:[!-~](?:[ -~]*[!-~])?)?")  # one line of printable ASCII, no space at either end


class LongTable(Table):
    """A Table (`render.table` makes them) whose plain rows print without rich's per-cell work."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown = self._plain_rows(console, options)
        if shown is None:
            yield from super().__rich_console__(console, options)
        else:
            yield from shown

    def add_plain_rows(self, rows: list[tuple[str, ...]]) -> None:
        """Rows of one string per column, unstyled: what `add_row` makes of each, without its checks
        per cell (thousands of rows: `gpuvm inventory`'s VMs)."""
        for column, cells in zip(self.columns, zip(*rows)):
            column._cells.extend(cells)
        self.rows.extend(Row() for _ in rows)

    def _plain_rows(self, console: Console, options: ConsoleOptions) -> list[Segment] | None:
        """The table's segments with its rows written here, or None where rich must render them."""
        if not self.rows or not self.box or any(row.style or row.end_section for row in self.rows):
            return None
        if any(column.justify not in ("left", "right") for column in self.columns):
            return None
        columns = [list(column._cells) for column in self.columns]
        if not all(isinstance(cell, str) for cells in columns for cell in cells):
            return None
        if not all(_plain(console, options, cell) for cell in {cell for cells in columns for cell in cells}):
            return None
        widest = [max(cells, key=len) for cells in columns]
        widths = [max(len(column.header) if isinstance(column.header, str) else 0, len(cell))
                  for column, cell in zip(self.columns, widest)]
        box = self.box.substitute(options, safe=self.safe_box if self.safe_box is not None else console.safe_box)
        box = box if self.show_header else box.get_plain_headed_box()
        bars = [(box.mid_left, box.mid_vertical, box.mid_right), (box.foot_left, box.foot_vertical, box.foot_right)]
        justify = [column.justify for column in self.columns]

        def line(cells: list[str], last: bool) -> str:
            left, between, right = bars[last]
            padded = (f" {c.rjust(w) if j == 'right' else c.ljust(w)} " for c, w, j in zip(cells, widths, justify))
            return left + between.join(padded) + right

        lines = list(Segment.split_lines(Table.__rich_console__(self._template(widest), console, options)))
        texts = ["".join(segment.text for segment in parts) for parts in lines]
        rows = [line(widest, False), line(widest, True)][-len(self.rows):]
        at = next((i for i in range(len(texts) - len(rows), -1, -1) if texts[i:i + len(rows)] == rows), None)
        if at is None or any(segment.style for parts in lines[at:at + len(rows)] for segment in parts):
            return None
        last = len(self.rows) - 1
        body = [[Segment(line(list(cells), i == last))] for i, cells in enumerate(zip(*columns))]
        return list(_joined([*lines[:at], *body, *lines[at + len(rows):]]))

    def _template(self, widest: list[str]) -> Table:
        """This table with one or two rows (as it has) of each column's widest cell, for rich to render."""
        template = copy.copy(self)
        template.columns = [copy.copy(column) for column in self.columns]
        for column, cell in zip(template.columns, widest):
            column._cells = [cell] * min(len(self.rows), 2)
        template.rows = [Row() for _ in template.columns[0]._cells]
        return template


def _plain(console: Console, options: ConsoleOptions, cell: str) -> bool:
    """Whether rich prints `cell` as it is: one line of printable ASCII that no markup or emoji code
    changes (as the console reads cells: printable first, where gpuvm's console does)."""
    return bool(_PLAIN.fullmatch(cell)) and \
        ((":" not in cell and "[" not in cell) or console.render_str(cell, markup=options.markup).plain == cell)


def _joined(lines: list[list[Segment]]) -> Iterator[Segment]:
    for parts in lines:
        yield from parts
        yield Segment.line()
