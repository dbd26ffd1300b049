"""The plan example of the README and of the user guide is what the renderer prints for the demo's
plan (captured from a real run on the simulator and the SSH test hosts: tests/unit/demo_plan.py),
shortened but not edited."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from gpuvm.render import print_plan
from tests.unit.demo_plan import demo_plan

REPO = Path(__file__).parents[2]


def plan_block(doc: str) -> list[str]:
    section = (REPO / doc).read_text().split("## What a plan looks like", 1)[1]
    return re.search(r"```\n(.*?)```", section, re.S).group(1).splitlines()


@pytest.mark.parametrize("doc", ["README.md", "docs/guide.md"])
def test_every_line_of_the_plan_example_is_printed_in_that_order(doc: str):
    console = Console(width=100, record=True, file=io.StringIO())
    print_plan(console, demo_plan())
    printed = console.export_text().splitlines()
    shown = plan_block(doc)
    assert shown[-1] == printed[-1]  # the summary line, as it is
    at = 0
    for line in shown:  # a subsequence: lines left out, none changed or moved
        assert line in printed[at:], f"{doc}: line not printed (or out of order): {line!r}"
        at = printed.index(line, at) + 1
