"""The README's plan example is what the renderer prints for the demo's plan (captured from a real
run on the simulator and the SSH test hosts: tests/unit/demo_plan.py), shortened but not edited."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from gpuvm.render import print_plan
from tests.unit.demo_plan import demo_plan

README = Path(__file__).parents[2] / "README.md"


def readme_plan_block() -> list[str]:
    section = README.read_text().split("### What a plan looks like", 1)[1]
    return re.search(r"```\n(.*?)```", section, re.S).group(1).splitlines()


def test_every_line_of_the_readme_plan_is_printed_in_that_order():
    console = Console(width=100, record=True, file=io.StringIO())
    print_plan(console, demo_plan())
    printed = console.export_text().splitlines()
    shown = readme_plan_block()
    assert shown[-1] == printed[-1]  # the summary line, as it is
    at = 0
    for line in shown:  # a subsequence: lines left out, none changed or moved
        assert line in printed[at:], f"README line not printed (or out of order): {line!r}"
        at = printed.index(line, at) + 1
