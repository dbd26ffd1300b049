"""nccl-tests `all_reduce_perf`: the figure is the footer `# Avg bus bandwidth : X` in GB/s.

Two table layouts exist. Current builds:
    #       size         count      type   redop    root     time   algbw   busbw #wrong ...
older builds have no `root` column and `error` instead of `#wrong`. Columns are read from the
header, so both work; each data row holds the out-of-place then the in-place half.

The other nccl-tests (alltoall_perf, all_gather_perf, ...) print the same table: their output is
refused, not read as all-reduce bandwidth. Newer builds name the test (`# Collective test starting:
alltoall_perf`); in any build a table whose `redop` is `none` holds no reduction.
"""

from __future__ import annotations

import re

from gpuvm.bench.parsers.common import Figure, tagged_lines
from gpuvm.errors import BenchmarkError

_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<value>\d+(?:\.\d*)?)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<count>\d+)\s*(?P<status>\w+)")
_CHECK_COLUMNS = ("#wrong", "error")
_COLLECTIVE = re.compile(r"^#\s*Collective test starting:\s*(?P<name>\S+)")


def _header(line: str) -> list[str] | None:
    """Column names when `line` is the table header, else None."""
    words = line.lstrip("#").split()
    if words[:2] == ["size", "count"] and "busbw" in words:
        return words
    return None


def _row(columns: list[str], words: list[str]) -> dict | None:
    """One size's figures, or None when `words` is not a data row of this table."""
    if len(words) != len(columns) or not words[0].isdigit():
        return None
    half = columns.index("time")  # out-of-place half starts at the first `time`
    width = (len(columns) - half) // 2
    try:
        row = {"size": int(words[0]), "type": words[columns.index("type")],
               "redop": words[columns.index("redop")] if "redop" in columns else None}
        for prefix, start in (("out_of_place", half), ("in_place", half + width)):
            named = dict(
                zip(columns[start : start + width], words[start : start + width], strict=True)
            )
            row[prefix] = {
                "time_us": float(named["time"]),
                "algbw": float(named["algbw"]),
                "busbw": float(named["busbw"]),
                "check": next((named[c] for c in _CHECK_COLUMNS if c in named), None),
            }
    except (ValueError, KeyError):
        return None
    return row


def _wrong(check: str | None) -> bool:
    """True when a `#wrong` count or an `error` magnitude says the results were wrong."""
    if check in (None, "N/A"):
        return False
    try:
        return float(check) > 1e-3 if "e" in check.lower() or "." in check else int(check) > 0
    except ValueError:
        return False


def parse_nccl_allreduce(text: str, log: str = "<output>") -> Figure:
    columns: list[str] | None = None
    rows: list[dict] = []
    average = None
    out_of_bounds = None
    for _rank, line in tagged_lines(text):
        if line.startswith("#"):
            columns = _header(line) or columns
            if (match := _COLLECTIVE.match(line)) and not match.group("name").startswith("all_reduce"):
                raise BenchmarkError(f"{log}: this is {match.group('name')}'s output, not all_reduce_perf's "
                                     "(its bandwidth is another collective's)")
            if match := _AVG.match(line):
                average = float(match.group("value"))
            elif match := _OOB.match(line):
                out_of_bounds = (int(match.group("count")), match.group("status"))
        elif columns and (row := _row(columns, line.split())):
            rows.append(row)
    if average is None:
        raise BenchmarkError(
            f"{log}: no '# Avg bus bandwidth' line found (expected nccl-tests all_reduce_perf output)"
        )
    if any(r["redop"] == "none" for r in rows):
        raise BenchmarkError(f"{log}: the table's redop is 'none': a collective without a reduction (alltoall_perf, "
                             "all_gather_perf, ...), not all_reduce_perf")
    wrong = [
        r["size"] for r in rows if any(_wrong(r[h]["check"]) for h in ("out_of_place", "in_place"))
    ]
    if wrong or (out_of_bounds and out_of_bounds[1] != "OK"):
        raise BenchmarkError(
            f"{log}: all_reduce_perf reported wrong results"
            + (f" at sizes {', '.join(map(str, wrong))}" if wrong else "")
            + (
                f" ({out_of_bounds[0]} out-of-bounds values)"
                if out_of_bounds and out_of_bounds[0]
                else ""
            )
        )
    detail = {
        "table": "new" if columns and "root" in columns else "old",
        "busbw_by_size": {r["size"]: r["out_of_place"]["busbw"] for r in rows},
        "busbw_in_place_by_size": {r["size"]: r["in_place"]["busbw"] for r in rows},
        "largest_size_busbw": rows[-1]["out_of_place"]["busbw"] if rows else None,
    }
    return Figure(value=average, unit="GB/s", detail=detail)
