"""Pure comparison of results: spread of repeats, scaling, and VM against bare metal.

For every point: median, min, max (and stdev with ≥ 2 repeats) of its repeats. Scaling benchmarks
also get speedup S(N) = T(N)/T(ref) against the smallest node count (1 when present; inverted for
lower-is-better figures such as minutes) and efficiency E(N) = S(N)/(GPUs(N)/GPUs(ref)), which is
S(N)/N when each node runs the same GPUs. Against a baseline at the same point, `ratio` is the VM's
performance relative to bare metal (vm/bm, or bm/vm for lower-is-better) and overhead = 1 − ratio.

Points of several setups (or network mappings) are compared within their own setup and mapping:
each has its own speedup reference. A point measured with the network mapping on has
`mapping_gain`: its figure relative to the same point with the mapping off. A point that read its
data from files has `data_overhead`: 1 − its figure relative to the same point on synthetic data
(seed 002's data-path experiment).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median, stdev

from gpuvm.bench.results import Benchmark, Point, Results


@dataclass(frozen=True)
class Spread:
    median: float
    min: float
    max: float
    stdev: float | None  # None with a single repeat
    repeats: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(
            median=median(values),
            min=min(values),
            max=max(values),
            stdev=stdev(values) if len(values) >= 2 else None,
            repeats=len(values),
        )


@dataclass(frozen=True)
class PointComparison:
    label: str  # "4 nodes", "2 VMs × 1 GPU"
    nodes: int
    gpus_per_node: int
    vms: int
    spread: Spread
    speedup: float | None = None
    efficiency: float | None = None
    baseline: float | None = None  # the baseline's median at the same point
    ratio: float | None = None  # VM performance / bare-metal performance
    overhead: float | None = None  # 1 − ratio
    per_vm: dict[str, float] | None = None  # concurrent points: median per VM
    total: float | None = None  # concurrent points: sum of the per-VM medians
    setup: str | None = None
    mapping: str | None = None  # network mapping "on" / "off", when the run measured both
    mapping_gain: float | None = None  # mapping on: performance relative to mapping off, minus 1
    data: str | None = None  # "files" / "synthetic", when the run measured both
    data_overhead: float | None = None  # files: 1 − performance relative to synthetic data


@dataclass(frozen=True)
class BenchmarkComparison:
    name: str
    kind: str
    unit: str
    higher_is_better: bool
    scenario: str
    scaling: str | None
    reference_nodes: int | None  # the point speedup is measured against
    points: list[PointComparison]


@dataclass(frozen=True)
class Violation:
    benchmark: str
    point: str
    overhead: float
    limit: float

    def __str__(self) -> str:
        return (
            f"{self.benchmark} at {self.point}: overhead {self.overhead * 100:.1f}% "
            f"exceeds {self.limit * 100:.1f}%"
        )


@dataclass(frozen=True)
class Comparison:
    environment: str
    baseline_environment: str | None
    benchmarks: list[BenchmarkComparison]
    note: str | None = None
    baseline_note: str | None = None
    max_overhead: float | None = None
    violations: list[Violation] = field(default_factory=list)


def compare(
    results: Results, baseline: Results | None = None, max_overhead: float | None = None
) -> Comparison:
    """Compare `results` (and against `baseline` where it has the same benchmark and point)."""
    benchmarks = []
    for bench in results.benchmarks:
        base = baseline.benchmark(bench.name) if baseline else None
        benchmarks.append(_compare_benchmark(bench, base))
    comparison = Comparison(
        environment=results.environment,
        baseline_environment=baseline.environment if baseline else None,
        benchmarks=benchmarks,
        note=results.note,
        baseline_note=baseline.note if baseline else None,
        max_overhead=max_overhead,
    )
    if max_overhead is not None:
        comparison.violations.extend(check_overhead(comparison, max_overhead))
    return comparison


def check_overhead(comparison: Comparison, max_overhead: float) -> list[Violation]:
    """Every point whose overhead against the baseline is above `max_overhead` (a fraction)."""
    return [
        Violation(bench.name, point.label, point.overhead, max_overhead)
        for bench in comparison.benchmarks
        for point in bench.points
        if exceeds(point.overhead, max_overhead)
    ]


def exceeds(overhead: float | None, limit: float | None) -> bool:
    """True when `overhead` is above `limit`; a float's last bit does not count (0.98 → 2 %)."""
    return overhead is not None and limit is not None and overhead > limit + 1e-9


def _compare_benchmark(bench: Benchmark, base: Benchmark | None) -> BenchmarkComparison:
    # only points with a successful repeat have a figure; failed repeats carry no value
    setups = list(dict.fromkeys(p.setup for p in bench.points))
    points = sorted((p for p in bench.points if _values(p)),
                    key=lambda p: (setups.index(p.setup), p.network_mapping != "on", p.network_mapping or "",
                                   p.data or "", p.nodes, p.gpus_per_node, p.vms))
    spreads = [Spread.of(_values(p)) for p in points]
    # speedup within each setup, mapping and data: against its smallest point
    references: dict[tuple, tuple[Point, Spread]] = {}
    for point, spread in zip(points, spreads, strict=True):
        references.setdefault((point.setup, point.network_mapping, point.data), (point, spread))
    mapping_off = {_unmapped_key(bench, p): s.median for p, s in zip(points, spreads, strict=True)
                   if p.network_mapping == "off"}
    synthetic = {(p.setup, p.network_mapping, p.nodes, p.gpus_per_node, p.vms): s.median
                 for p, s in zip(points, spreads, strict=True) if p.data == "synthetic"}
    reference = points[0] if bench.scenario == "scaling" and points else None
    base_medians = _baseline_medians(bench, base)
    compared = []
    for point, spread in zip(points, spreads, strict=True):
        speedup = efficiency = None
        if reference is not None:
            ref, ref_spread = references[(point.setup, point.network_mapping, point.data)]
            speedup = _performance_ratio(spread.median, ref_spread.median, bench.higher_is_better)
            efficiency = speedup / (point.gpus / ref.gpus) if speedup is not None else None
        gain = None
        if point.network_mapping == "on" and (off := mapping_off.get(_unmapped_key(bench, point))):
            ratio_on = _performance_ratio(spread.median, off, bench.higher_is_better)
            gain = ratio_on - 1 if ratio_on is not None else None
        data_overhead = None
        if point.data == "files" and (on_synthetic := synthetic.get(
                (point.setup, point.network_mapping, point.nodes, point.gpus_per_node, point.vms))):
            ratio_files = _performance_ratio(spread.median, on_synthetic, bench.higher_is_better)
            data_overhead = 1 - ratio_files if ratio_files is not None else None
        bm = base_medians.get(_baseline_key(bench, point))
        ratio = _performance_ratio(spread.median, bm, bench.higher_is_better) if bm else None
        per_vm = _per_vm_medians(point)
        compared.append(
            PointComparison(
                label=point_label(bench, point) + (f", mapping {point.network_mapping}" if point.network_mapping else "")
                + (f", {point.data}" if point.data else ""),
                nodes=point.nodes,
                gpus_per_node=point.gpus_per_node,
                vms=point.vms,
                spread=spread,
                speedup=speedup,
                efficiency=efficiency,
                baseline=bm,
                ratio=ratio,
                overhead=1 - ratio if ratio is not None else None,
                per_vm=per_vm,
                total=sum(per_vm.values()) if per_vm else None,
                setup=point.setup,
                mapping=point.network_mapping,
                mapping_gain=gain,
                data=point.data,
                data_overhead=data_overhead,
            )
        )
    return BenchmarkComparison(
        name=bench.name,
        kind=bench.kind,
        unit=bench.unit or (base.unit if base else ""),
        higher_is_better=bench.higher_is_better,
        scenario=bench.scenario,
        scaling=bench.scaling,
        reference_nodes=reference.nodes if reference else None,
        points=compared,
    )


def point_label(bench: Benchmark, point: Point) -> str:
    """How a point reads in tables: "4 nodes", "1 node × 2 GPUs", "2 VMs × 1 GPU"."""
    if bench.scenario == "concurrent" or point.vms > point.nodes:
        per_vm, rest = divmod(point.gpus, point.vms)
        gpus = f"{per_vm} GPU{'s' if per_vm != 1 else ''}" if not rest else f"{point.gpus} GPUs"
        label = f"{point.vms} VM{'s' if point.vms != 1 else ''} × {gpus}"
        return label + (f" on {point.nodes} nodes" if point.nodes > 1 else "")
    label = f"{point.nodes} node{'s' if point.nodes != 1 else ''}"
    return label + (f" × {point.gpus_per_node} GPUs" if point.gpus_per_node > 1 else "")


def _unmapped_key(bench: Benchmark, point: Point) -> tuple:
    return (point.setup, point.nodes, point.gpus_per_node, point.vms)


def _performance_ratio(value: float, against: float | None, higher_is_better: bool) -> float | None:
    """How many times better `value` is than `against` (time figures invert)."""
    if not against or not value:
        return None
    return value / against if higher_is_better else against / value


def _baseline_key(bench: Benchmark, point: Point) -> tuple[int, ...]:
    # A bare-metal baseline has no VMs: match scaling points by nodes, concurrent ones by GPUs.
    return (point.nodes,) if bench.scenario == "scaling" else (point.nodes, point.gpus_per_node)


def _baseline_medians(bench: Benchmark, base: Benchmark | None) -> dict[tuple[int, ...], float]:
    if base is None:
        return {}
    return {_baseline_key(bench, p): median(_values(p)) for p in base.points if _values(p)}


def _values(point: Point) -> list[float]:
    """The figures of the point's successful repeats."""
    return [r.value for r in point.repeats if r.value is not None]


def _per_vm_medians(point: Point) -> dict[str, float] | None:
    repeats = [r for r in point.repeats if r.value is not None]
    if not any(r.per_vm for r in repeats):
        return None
    names = sorted({name for r in repeats for name in (r.per_vm or {})})
    return {
        name: median(r.per_vm[name] for r in repeats if r.per_vm and name in r.per_vm)
        for name in names
    }
