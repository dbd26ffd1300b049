"""gpuvm's tables (render.table: a LongTable) print exactly as rich's own Table prints them, whatever
the cells, widths and terminal; and plain rows are written without rich rendering each cell (4,096
VMs in `gpuvm inventory` took 13 s of rich's per-cell work)."""

from __future__ import annotations

import copy
import io
import random

import pytest
from rich.console import Console
from rich.table import Table

from gpuvm.cli.common import _safe_console
from gpuvm.render import table

ROWS = [("esx-01", "connected", 12), ("esx-02", "maintenance", 1)]
CASES = {
    "plain": ("Hosts", ["host", "state", "VMs"], ROWS, {}),
    "one row": ("Hosts", ["host", "state", "VMs"], ROWS[:1], {}),
    "no title, empty cells": (None, ["host", "state", "VMs"], [*ROWS, ("x", "", None)], {}),
    "figures right-aligned": ("T", ["name", "GPUs", "memory"], [("a", 1, 2), ("bb", 10, 200)], {"numbers_from": 1}),
    "pci and brackets": ("GPUs", ["address", "model"], [("0000:3b:00.0", "GA100 [A100 PCIe 80GB]"), ("b", "c")], {}),
    "emoji code": ("T", ["a", "b"], [(":thumbs_up:", "x"), ("a", "b")], {}),
    "markup": ("T", ["a", "b"], [("x [bold]y[/]", "z"), ("a", "b")], {}),
    "spaces": ("T", ["a", "b"], [("x  y", " z "), ("a", "b")], {}),
    "newline and tab": ("T", ["a", "b"], [("a", "b\nc"), ("\tx", "y")], {}),
    "wide characters": ("T", ["a", "b"], [("日本語", "é"), ("a", "b")], {}),
    "control characters": ("T", ["h\x1bx", "b"], [("a\x1b]0;x\x07", 1), ("bb", 10)], {}),
    "long title": ("A title longer than the table it names", ["a", "b"], [("x", "y"), ("a", "b")], {}),
    "wider than the console": ("T", ["a", "b"], [("x" * 100, "y" * 100), ("a", "b")], {}),
    "row styles": ("T", ["name", "n"], [("a", 1), ("bb", 10)], {"styles": ["red", None]}),
    "sections": ("T", ["name", "n"], [("a", 1), ("bb", 10), ("c", 3)], {"sections": [1]}),
    "caption": ("T", ["name", "n"], [("a", 1), ("bb", 10)], {"caption": "a caption under it"}),
    "no rows": ("T", ["name", "n"], [], {}),
}


def printed(made: Table, width: int, terminal: bool, markup: bool, rich_only: bool = False) -> str:
    if rich_only:
        made = copy.copy(made)
        made.__class__ = Table
    file = io.StringIO()
    console = _safe_console(file=file, width=width, highlight=False, markup=markup, force_terminal=terminal,
                            color_system="truecolor" if terminal else None)
    console.print(made)
    return file.getvalue()


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
@pytest.mark.parametrize("width", [160, 24, 8])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_table_prints_as_richs_own(case, width, terminal):
    title, columns, rows, options = CASES[case]
    made = table(title, columns, rows, **options)
    assert printed(made, width, terminal, markup=terminal) == printed(made, width, terminal, terminal, rich_only=True)


def test_random_tables_print_as_richs_own():
    pick = random.Random(34)
    words = ["", "a", "abc def", "0000:3b:00.0", "GA100 [A100]", "x [bold]y", ":smile:", "é", 7, None, "x" * 30]
    for n in range(200):
        rows = [tuple(pick.choice(words) for _ in range(3)) for _ in range(pick.randint(0, 5))]
        made = table(pick.choice([None, "Title"]), ["c1", "column two", "3"], rows,
                     numbers_from=pick.choice([None, 1]))
        width, terminal, markup = pick.choice([160, 30]), n % 2 == 0, n % 3 == 0
        assert printed(made, width, terminal, markup) == printed(made, width, terminal, markup, rich_only=True), rows


def test_plain_rows_are_not_rendered_cell_by_cell(mocker):
    rows = [(f"esx-{i:04d}-vm{i % 8}", f"esx-{i // 8:04d}", "poweredOn", "0000:3b:00.0") for i in range(2000)]
    cells = mocker.spy(Console, "render_lines")
    lines = printed(table("VMs", ["vm", "host", "power", "PCI"], rows), 160, False, False).splitlines()
    assert lines[4] == "│ esx-0000-vm0 │ esx-0000 │ poweredOn │ 0000:3b:00.0 │"
    assert len(lines) == 2000 + 5  # title, top border, header, its rule, the rows, the bottom border
    assert cells.call_count < 50  # the header and two rows for the widths (rich alone: 8,000 cells)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rows_added_in_bulk_print_as_rows_added_one_by_one(case):
    """`render.table` adds unstyled rows in one go (LongTable.add_plain_rows): rich's own add_row of
    each row must print the same table."""
    title, columns, rows, options = CASES[case]
    made = table(title, columns, rows, **options)
    one_by_one = table(title, columns, [], **{k: v for k, v in options.items() if k == "numbers_from"},
                       caption=options.get("caption"))
    styles, starts = options.get("styles", ()), set(options.get("sections", ()))
    for i, row in enumerate(rows):
        if i in starts and i:
            one_by_one.add_section()
        Table.add_row(one_by_one, *("" if cell is None else str(cell) for cell in row),
                      style=styles[i] if i < len(styles) else None)
    for width, terminal in ((160, False), (24, True)):
        assert printed(made, width, terminal, terminal) == printed(one_by_one, width, terminal, terminal)
