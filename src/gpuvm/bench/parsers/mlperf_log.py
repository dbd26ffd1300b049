"""MLPerf logs: `:::MLLOG {json}` lines, maybe behind a `0: ` rank prefix.

The score is the time from `run_start` to `run_stop`, in minutes; lower is better.
"""

from __future__ import annotations

import json
import re

from gpuvm.bench.parsers.common import Figure, tagged_lines
from gpuvm.errors import BenchmarkError

_MLLOG = re.compile(r":::MLLOG\s+(?P<json>\{.*\})\s*$")


def parse_mlperf_log(text: str, log: str = "<output>") -> Figure:
    start = stop = None
    detail: dict = {}
    for _rank, line in tagged_lines(text, rank_colon=True):
        match = _MLLOG.search(line)
        if not match:
            continue
        try:
            event = json.loads(match.group("json"))
        except json.JSONDecodeError:
            continue  # a line cut by another rank's output; the launcher interleaves
        key = event.get("key")
        if key == "run_start" and start is None:
            start = event
        elif key == "run_stop" and start is not None and stop is None:
            stop = event
        elif key in ("submission_benchmark", "global_batch_size", "submission_division"):
            detail.setdefault(key, event.get("value"))
        elif key == "eval_accuracy":
            detail["eval_accuracy"] = event.get("value")
    if start is None or stop is None:
        missing = "run_start" if start is None else "run_stop"
        raise BenchmarkError(
            f"{log}: no ':::MLLOG' {missing} event found (expected an MLPerf training log)"
        )
    status = (stop.get("metadata") or {}).get("status", "success")
    if status != "success":
        raise BenchmarkError(f"{log}: MLPerf run_stop status is {status!r}, not 'success'")
    minutes = (float(stop["time_ms"]) - float(start["time_ms"])) / 60000.0
    detail["status"] = status
    return Figure(value=minutes, unit="min", detail=detail, higher_is_better=False)
