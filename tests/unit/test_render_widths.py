"""The demo's plan (94+ changes on 6 targets, captured from a real run: tests/unit/demo_plan.py) as
text at 80, 100 and 160 columns: one line per change, none wrapped at 100 or more."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpuvm.render import change_line, plan_summary, print_plan
from tests.unit.demo_plan import demo_plan


def rendered(width: int, form: str = "text") -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO(), force_terminal=True)  # a terminal that wide
    print_plan(console, demo_plan(), form)
    return console.export_text().splitlines()


def test_the_captured_plan_is_the_demos():
    assert plan_summary(demo_plan()).startswith("Plan: 96 change(s) on 6 target(s) (19 need host reboot)")


@pytest.mark.parametrize("width", [100, 160])
def test_no_line_wraps_at_100_columns_or_more(width):
    plan = demo_plan()
    lines = rendered(width)
    assert max(len(line.rstrip()) for line in lines) <= width
    for change in plan.changes:  # each change whole, on one line of its own, within 100 columns
        assert f"    {change_line(change)}" in lines
        assert len(f"    {change_line(change)}") <= 100
    targets = [line for line in lines if line and not line.startswith(" ")][:len(plan.targets())]
    assert targets == plan.targets()
    assert lines[-1] == plan_summary(plan)
    assert len(lines) < 2 * len(plan.changes)  # the table took ~200 lines for these 96 changes


def test_at_80_columns_long_changes_are_left_to_the_terminal_to_wrap_whole():
    lines = rendered(80)
    for change in demo_plan().changes:
        assert f"    {change_line(change)}" in lines  # never cut, never reflowed by the renderer


def test_the_table_is_still_there():
    lines = rendered(160, "table")
    assert any("┃ step" in line and "┃ disruption" in line for line in lines)
