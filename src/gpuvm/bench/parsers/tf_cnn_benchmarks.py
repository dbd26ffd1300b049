"""tf_cnn_benchmarks: `total images/sec: X` between two lines of dashes.

Under Horovod every rank prints its own total, already multiplied by the number of workers, so the
totals are never summed: the figure is rank 0's (or the first printed when lines carry no rank);
the others go into `detail` as min and mean.
"""

from __future__ import annotations

import re
from statistics import fmean

from gpuvm.bench.parsers.common import Figure, tagged_lines
from gpuvm.errors import BenchmarkError

_TOTAL = re.compile(r"total images/sec:\s*(?P<value>\d+(?:\.\d*)?)")
_MODEL = re.compile(r"^Model:\s+(?P<model>\S+)")
_BATCH = re.compile(r"^Batch size:\s+(?P<global>\d+) global")
_PER_DEVICE = re.compile(r"^\s+(?P<per>\d+) per device")


def parse_tf_cnn_benchmarks(text: str, log: str = "<output>") -> Figure:
    totals: list[tuple[int | None, float]] = []
    detail: dict = {}
    for rank, line in tagged_lines(text):
        if match := _TOTAL.search(line):
            totals.append((rank, float(match.group("value"))))
        elif rank in (0, None):
            if match := _MODEL.match(line):
                detail.setdefault("model", match.group("model"))
            elif match := _BATCH.match(line):
                detail.setdefault("batch_size_global", int(match.group("global")))
            elif match := _PER_DEVICE.match(line):
                detail.setdefault("batch_size_per_device", int(match.group("per")))
    if not totals:
        raise BenchmarkError(
            f"{log}: no 'total images/sec' line found (expected tf_cnn_benchmarks output)"
        )
    rank0 = [value for rank, value in totals if rank == 0]
    value = rank0[0] if rank0 else totals[0][1]
    values = [value for _, value in totals]
    detail.update(
        ranks_reporting=len(totals),
        rank_totals_min=min(values),
        rank_totals_mean=fmean(values),
        source="rank 0" if rank0 else "first total printed",
    )
    return Figure(value=value, unit="images/sec", detail=detail)
