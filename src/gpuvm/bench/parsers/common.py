"""What every parser returns, and the line-prefix handling they share."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# mpirun --tag-output: "[1,0]<stdout>:" (job, rank); horovodrun with Gloo: "[0]<stdout>:" (rank).
_TAG = re.compile(r"^\[(?:\d+,)?(?P<rank>\d+)\]<(?:stdout|stderr)>:\s?")
# srun -l / MLPerf reference launchers: "0: " (rank) before the line.
_RANK_COLON = re.compile(r"^(?P<rank>\d+):\s")


@dataclass(frozen=True)
class Figure:
    """One number a benchmark run produced, with its unit and what else the log said."""

    value: float
    unit: str
    detail: dict[str, Any] = field(default_factory=dict)
    higher_is_better: bool = True
    metrics: dict[str, float] = field(default_factory=dict)  # other figures results.json keeps (IOPS, latencies)


def tagged_lines(text: str, rank_colon: bool = False) -> Iterator[tuple[int | None, str]]:
    """Yield (rank or None, line without its launcher prefix) for every line of `text`.

    `rank_colon` also strips a bare `N: ` prefix; only MLPerf logs use it, elsewhere a line such
    as `100: ...` would be mistaken for one.
    """
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        match = _TAG.match(line) or (_RANK_COLON.match(line) if rank_colon else None)
        if match:
            yield int(match.group("rank")), line[match.end() :]
        else:
            yield None, line
