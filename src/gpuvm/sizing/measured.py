"""Measurements for `gpuvm size --results`: the median images/s of a results.json point (in place of
the estimate), and the read rate its storage benchmarks measured (beside the rate needed)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from gpuvm.errors import InputError

RATE_UNITS = ("img/sec", "images/sec")  # horovod_synthetic and pytorch_train; tf_cnn_benchmarks


def measured_throughput(path: Path, benchmark: str | None = None, gpus: int | None = None,
                        required: bool = True) -> tuple[float, int, str] | None:
    """(samples/s, GPUs, description) of one point: the benchmark named (or the only one measured in
    images per second), at `gpus` GPUs (default: its largest point). The value is the median of the
    point's successful repeats, summed over the VMs of a concurrent point. None when the results
    have no such benchmark, none is named and none is `required`."""
    from gpuvm.bench.results import load_results

    results = load_results(path)
    rated = [b for b in results.benchmarks if b.unit in RATE_UNITS]
    if benchmark is None and not rated and not required:
        return None
    if benchmark is not None:
        chosen = results.benchmark(benchmark)
        if chosen is None:
            raise InputError(f"{path}: no benchmark {benchmark!r} (it has {', '.join(b.name for b in results.benchmarks)})")
    elif len(rated) == 1:
        chosen = rated[0]
    else:
        names = ", ".join(b.name for b in rated) or "none"
        raise InputError(f"{path}: give --benchmark: benchmarks measured in images per second: {names}")
    points = [p for p in chosen.points if gpus is None or p.gpus == gpus]
    values = [[r.value for r in p.repeats if r.value is not None] for p in points]
    measured = [(p, v) for p, v in zip(points, values, strict=True) if v]
    if not measured:
        where = f" at {gpus} GPU(s)" if gpus else ""
        raise InputError(f"{path}: benchmark {chosen.name} has no successful run{where}")
    point, runs = max(measured, key=lambda pv: pv[0].gpus)
    rate = statistics.median(runs)
    on = f", {point.data}" if point.data else ""  # compare_synthetic: files first, the real data path
    return rate, point.gpus, f"measured: {chosen.name}, {point.gpus} GPU(s){on}, median of {len(runs)} run(s)"


def measured_sample_kb(path: Path, benchmark: str | None = None) -> tuple[float, str] | None:
    """(KB, where from) of one sample as the results read it: the file size of the dataset gpuvm wrote
    for the benchmark named, else for the one benchmark (or several of one size) that had one."""
    from gpuvm.bench.results import load_results

    read = [b for b in load_results(path).benchmarks if b.dataset is not None and benchmark in (None, b.name)]
    sizes = {b.dataset.file_kb for b in read if b.dataset is not None}
    if len(sizes) != 1:
        return None
    file_kb = sizes.pop()
    return file_kb, f"sample_kb: {file_kb:g} KB, the files of {', '.join(b.name for b in read)}'s dataset (--results)"


@dataclass(frozen=True)
class MeasuredStorage:
    benchmark: str
    gb_per_s: float
    source: str


def measured_storage(path: Path) -> list[MeasuredStorage]:
    """Every storage (fio) benchmark of the results: the median read rate of its point with the
    most VMs reading at once (a concurrent point's rate is the sum over its VMs)."""
    from gpuvm.bench.results import load_results

    found = []
    for bench in load_results(path).benchmarks:
        runs = [(p, [r.value for r in p.repeats if r.value is not None]) for p in bench.points]
        runs = [(p, values) for p, values in runs if values]
        if bench.kind != "storage" or not runs:
            continue
        point, values = max(runs, key=lambda pv: pv[0].vms)
        found.append(MeasuredStorage(bench.name, statistics.median(values),
                                     f"fio: {bench.name}, {point.vms} VM(s) at once, median of {len(values)} run(s)"))
    return found
