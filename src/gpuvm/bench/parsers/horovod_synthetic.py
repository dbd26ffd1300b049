"""Horovod's synthetic benchmarks (tensorflow2/pytorch): rank 0 prints the totals.

    Iter #0: 199.4 img/sec per GPU
    Img/sec per GPU: 234.8 +-42.0
    Total img/sec on 16 GPU(s): 3756.0 +-672.7

The ± is 1.96 σ over the timed iterations (warm-up excluded). On CPU Horovod writes CPU for GPU.
"""

from __future__ import annotations

import re

from gpuvm.bench.parsers.common import Figure, tagged_lines
from gpuvm.errors import BenchmarkError

_NUM = r"\d+(?:\.\d*)?"
_TOTAL = re.compile(
    rf"Total img/sec on (?P<workers>\d+) (?P<device>GPU|CPU)\(s\):\s*(?P<value>{_NUM})"
    rf"(?:\s*\+-\s*(?P<conf>{_NUM}))?"
)
_PER_DEVICE = re.compile(
    rf"Img/sec per (?:GPU|CPU):\s*(?P<value>{_NUM})(?:\s*\+-\s*(?P<conf>{_NUM}))?"
)
_ITER = re.compile(rf"Iter #(?P<iter>\d+):\s*(?P<value>{_NUM}) img/sec per (?:GPU|CPU)")
_MODEL = re.compile(r"^Model:\s*(?P<model>\S+)")
_BATCH = re.compile(r"^Batch size:\s*(?P<batch>\d+)")


def parse_horovod_synthetic(text: str, log: str = "<output>") -> Figure:
    total = None
    detail: dict = {"iterations": []}
    for rank, line in tagged_lines(text):
        if rank not in (0, None):
            continue  # only rank 0 reports; anything else is noise
        if total is None and (match := _TOTAL.search(line)):
            total = match
        elif match := _PER_DEVICE.search(line):
            detail["per_device"] = float(match.group("value"))
            if match.group("conf"):
                detail["per_device_conf"] = float(match.group("conf"))
        elif match := _ITER.search(line):
            detail["iterations"].append(float(match.group("value")))
        elif match := _MODEL.match(line):
            detail.setdefault("model", match.group("model"))
        elif match := _BATCH.match(line):
            detail.setdefault("batch_size", int(match.group("batch")))
    if total is None:
        raise BenchmarkError(
            f"{log}: no 'Total img/sec on N GPU(s)' line found "
            "(expected Horovod synthetic benchmark output from rank 0)"
        )
    detail["workers"] = int(total.group("workers"))
    detail["device"] = total.group("device")
    if total.group("conf"):
        detail["total_conf"] = float(total.group("conf"))
    return Figure(value=float(total.group("value")), unit="img/sec", detail=detail)
