"""Any command: the user gives a regular expression with one group that captures the figure."""

from __future__ import annotations

import re

from gpuvm.bench.parsers.common import Figure, tagged_lines
from gpuvm.errors import BenchmarkError, InputError


def parse_command(
    text: str,
    log: str = "<output>",
    *,
    pattern: str,
    unit: str = "",
    higher_is_better: bool = True,
) -> Figure:
    """The last match of `pattern` (one capture group) in `text`, as a number."""
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise InputError(f"pattern {pattern!r} is not a valid regular expression: {e}") from None
    if regex.groups != 1:
        raise InputError(f"pattern {pattern!r} has {regex.groups} groups (expected exactly one)")
    found = None
    for _rank, line in tagged_lines(text):
        for match in regex.finditer(line):
            found = match.group(1)
    if found is None:
        raise BenchmarkError(f"{log}: no line matches {pattern!r}")
    try:
        value = float(found.replace(",", ""))
    except ValueError:
        raise BenchmarkError(
            f"{log}: {pattern!r} captured {found!r}, which is not a number"
        ) from None
    return Figure(
        value=value, unit=unit, detail={"matched": found}, higher_is_better=higher_is_better
    )
