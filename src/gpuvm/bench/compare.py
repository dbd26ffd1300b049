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

Uncertainty (gpuvm.bench.stats): every point's median has a 95 % bootstrap interval (3 repeats or
more), and so have speedup, efficiency, ratio and overhead. `--max-overhead X` gives each point
compared against the baseline a `Verdict`: pass when the whole overhead interval is within X, fail
when it is wholly beyond X, inconclusive when it straddles X or there is no interval. A point whose
figures are missing or invalid (every run failed, a zero figure) fails the gate, named.

With a baseline, `environment_warnings` names how the environments recorded with the repeats
differ (driver, CUDA, frameworks, CPU governor, throttle reasons, clocks): a warning, not a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median, stdev

from gpuvm.bench import stats
from gpuvm.bench.environment import differences
from gpuvm.bench.results import Benchmark, Point, Results
from gpuvm.bench.stats import Interval

# `bench compare --max-overhead`: the exit code of each verdict (docs/guide.md: "Exit codes")
VERDICT_EXIT_CODES = {"pass": 0, "fail": 9, "inconclusive": 10}


@dataclass(frozen=True)
class Spread:
    median: float
    min: float
    max: float
    stdev: float | None  # None with a single repeat
    repeats: int  # the runs that gave a figure
    ci: Interval | None = None  # 95 % interval of the median; None with fewer than 3 repeats
    outliers: list[int] = field(default_factory=list)  # 1-based repeats flagged (modified z-score)
    drift: float | None = None  # last half of the repeats against the first half, when they drift apart
    failed: int = 0  # runs of the point that gave no figure
    warmups: int = 0  # warm-up runs before the repeats, excluded

    @classmethod
    def of(cls, values: list[float], failed: int = 0, warmups: int = 0) -> Spread:
        return cls(
            median=median(values),
            min=min(values),
            max=max(values),
            stdev=stdev(values) if len(values) >= 2 else None,
            repeats=len(values),
            ci=stats.median_ci(values),
            outliers=stats.outliers(values),
            drift=stats.drift(values),
            failed=failed,
            warmups=warmups,
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
    speedup_ci: Interval | None = None  # 95 % intervals (None: fewer than 3 repeats, or the reference)
    efficiency_ci: Interval | None = None
    baseline_repeats: int = 0  # the baseline's runs with a figure at this point
    baseline_ci: Interval | None = None
    ratio_ci: Interval | None = None
    overhead_ci: Interval | None = None
    invalid: str | None = None  # why a point with a baseline has no ratio (a zero figure)


@dataclass(frozen=True)
class FailedPoint:
    """A point none of whose runs gave a figure: not in the table, but named (and a gate fails)."""

    label: str
    runs: int
    error: str  # the first run's error


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
    failed_points: list[FailedPoint] = field(default_factory=list)
    has_baseline: bool = False  # the baseline has this benchmark


@dataclass(frozen=True)
class Verdict:
    """What the data say about one point against `--max-overhead`: pass, fail or inconclusive."""

    benchmark: str
    point: str
    outcome: str  # "pass", "fail", "inconclusive"
    limit: float
    overhead: float | None
    overhead_ci: Interval | None
    repeats: int
    baseline_repeats: int
    settle: int | None = None  # inconclusive: repeats each side that would likely settle it
    reason: str | None = None  # a fail without a figure: why
    subject: str = "VM"
    against: str = "bare metal"

    def __str__(self) -> str:
        head = f"{self.benchmark} at {self.point}: {self.subject} within {_pct(self.limit)} of {self.against}"
        if self.overhead is None or self.reason:
            return f"{head}: no — {self.reason}"
        answer = {"pass": "yes", "fail": "no"}.get(self.outcome, "inconclusive")
        text = f"{head}: {answer} — overhead {_pct(self.overhead)} ({self._interval()})"
        if self.outcome == "inconclusive":
            if self.settle is None:
                text += "; the median sits on the limit: no number of repeats settles it"
            elif self.settle > stats.SETTLE_CAP:
                text += f"; more than {stats.SETTLE_CAP} repeats each would be needed to settle it"
            else:
                text += f"; about {self.settle} repeats each would likely settle it"
        return text

    def _interval(self) -> str:
        runs = (f"{self.repeats} repeat{'s' if self.repeats != 1 else ''} each"
                if self.repeats == self.baseline_repeats
                else f"{self.repeats} {self.subject} and {self.baseline_repeats} {self.against} repeats")
        if self.overhead_ci is None:
            return f"no interval: {runs}, {stats.MIN_REPEATS} needed"
        low, high = self.overhead_ci
        return f"{stats.LEVEL * 100:.0f} % CI {_pct(low, '')}–{_pct(high)}, {runs}"


def _pct(value: float, unit: str = " %") -> str:
    return f"{value * 100:.1f}{unit}"


@dataclass(frozen=True)
class Comparison:
    environment: str
    baseline_environment: str | None
    benchmarks: list[BenchmarkComparison]
    note: str | None = None
    baseline_note: str | None = None
    max_overhead: float | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    environment_warnings: list[str] = field(default_factory=list)  # how the two sides' environments differ

    @property
    def violations(self) -> list[Verdict]:
        """The points that fail the gate."""
        return [v for v in self.verdicts if v.outcome == "fail"]

    @property
    def verdict(self) -> str | None:
        """The campaign's verdict: fail if a point fails, else inconclusive if a point is (or no
        point could be checked), else pass; None without `--max-overhead`."""
        if self.max_overhead is None:
            return None
        outcomes = {v.outcome for v in self.verdicts}
        return next((o for o in ("fail", "inconclusive") if o in outcomes), "pass" if outcomes else "inconclusive")


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
        environment_warnings=differences(results, baseline) if baseline else [],
    )
    if max_overhead is not None:
        comparison.verdicts.extend(check_overhead(comparison, max_overhead))
    return comparison


def check_overhead(comparison: Comparison, max_overhead: float) -> list[Verdict]:
    """A verdict for every point compared against the baseline (and every point of a benchmark
    with a baseline that has no valid figure: a failure), against `max_overhead` (a fraction)."""
    words = ({"subject": "VM", "against": "bare metal"}
             if (comparison.environment, comparison.baseline_environment) == ("vm", "bare-metal")
             else {"subject": comparison.environment, "against": "the baseline"})
    verdicts = []
    for bench in comparison.benchmarks:
        for point in bench.points:
            if point.baseline is None:
                continue
            common = dict(benchmark=bench.name, point=point.label, limit=max_overhead, overhead=point.overhead,
                          overhead_ci=point.overhead_ci, repeats=point.spread.repeats,
                          baseline_repeats=point.baseline_repeats, **words)
            if point.overhead is None:
                verdicts.append(Verdict(outcome="fail", reason=point.invalid or "no ratio", **common))
                continue
            verdicts.append(Verdict(outcome=_outcome(point.overhead_ci, max_overhead), settle=stats.repeats_to_settle(
                min(point.spread.repeats, point.baseline_repeats), point.overhead_ci, point.overhead, max_overhead),
                **common))
        if bench.has_baseline:
            verdicts.extend(
                Verdict(benchmark=bench.name, point=f.label, outcome="fail", limit=max_overhead, overhead=None,
                        overhead_ci=None, repeats=0, baseline_repeats=0, **words,
                        reason=f"no valid figure: {'the' if f.runs == 1 else f'all {f.runs}'} run"
                               f"{'s' if f.runs != 1 else ''} failed ({f.error})")
                for f in bench.failed_points)
    return verdicts


def _outcome(interval: Interval | None, limit: float) -> str:
    if interval is not None and interval[1] <= limit + 1e-9:
        return "pass"
    if interval is not None and interval[0] > limit + 1e-9:
        return "fail"
    return "inconclusive"


def exceeds(overhead: float | None, limit: float | None) -> bool:
    """True when `overhead` is above `limit`; a float's last bit does not count (0.98 → 2 %)."""
    return overhead is not None and limit is not None and overhead > limit + 1e-9


def _compare_benchmark(bench: Benchmark, base: Benchmark | None) -> BenchmarkComparison:
    # only points with a successful repeat have a figure; the others are named as failed points
    setups = list(dict.fromkeys(p.setup for p in bench.points))
    points = sorted((p for p in bench.points if _values(p)),
                    key=lambda p: (setups.index(p.setup), p.network_mapping != "on", p.network_mapping or "",
                                   p.data or "", p.nodes, p.gpus_per_node, p.vms))
    failed = [FailedPoint(_label(bench, p), len(p.repeats), next((r.error for r in p.repeats if r.error), "no figure"))
              for p in bench.points if not _values(p)]
    spreads = [Spread.of(_values(p), failed=sum(1 for r in p.repeats if not r.ok), warmups=len(p.warmups))
               for p in points]
    # speedup within each setup, mapping and data: against its smallest point
    references: dict[tuple, tuple[Point, Spread]] = {}
    for point, spread in zip(points, spreads, strict=True):
        references.setdefault((point.setup, point.network_mapping, point.data), (point, spread))
    mapping_off = {_unmapped_key(bench, p): s.median for p, s in zip(points, spreads, strict=True)
                   if p.network_mapping == "off"}
    synthetic = {(p.setup, p.network_mapping, p.nodes, p.gpus_per_node, p.vms): s.median
                 for p, s in zip(points, spreads, strict=True) if p.data == "synthetic"}
    reference = points[0] if bench.scenario == "scaling" and points else None
    base_values = _baseline_values(bench, base)
    better = bench.higher_is_better

    def performance(value: float, against: float) -> float | None:
        return _performance_ratio(value, against, better)

    compared = []
    for point, spread in zip(points, spreads, strict=True):
        values = _values(point)
        speedup = efficiency = speedup_ci = efficiency_ci = None
        if reference is not None:
            ref, ref_spread = references[(point.setup, point.network_mapping, point.data)]
            speedup = _performance_ratio(spread.median, ref_spread.median, better)
            scale = point.gpus / ref.gpus
            efficiency = speedup / scale if speedup is not None else None
            if ref is not point:
                speedup_ci = stats.ratio_ci(values, _values(ref), performance)
                efficiency_ci = (speedup_ci[0] / scale, speedup_ci[1] / scale) if speedup_ci else None
        gain = None
        if point.network_mapping == "on" and (off := mapping_off.get(_unmapped_key(bench, point))):
            ratio_on = _performance_ratio(spread.median, off, better)
            gain = ratio_on - 1 if ratio_on is not None else None
        data_overhead = None
        if point.data == "files" and (on_synthetic := synthetic.get(
                (point.setup, point.network_mapping, point.nodes, point.gpus_per_node, point.vms))):
            ratio_files = _performance_ratio(spread.median, on_synthetic, better)
            data_overhead = 1 - ratio_files if ratio_files is not None else None
        bm_values = base_values.get(_baseline_key(bench, point))
        bm = median(bm_values) if bm_values else None
        ratio = _performance_ratio(spread.median, bm, better) if bm_values else None
        ratio_ci = stats.ratio_ci(values, bm_values, performance) if ratio is not None and bm_values else None
        invalid = None
        if bm_values is not None and ratio is None:
            invalid = (f"the baseline has no valid figure at {_label(bench, point)}" if not bm_values
                       else f"a figure of {spread.median:g} cannot be compared")
        per_vm = _per_vm_medians(point)
        compared.append(
            PointComparison(
                label=_label(bench, point),
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
                speedup_ci=speedup_ci,
                efficiency_ci=efficiency_ci,
                baseline_repeats=len(bm_values or ()),
                baseline_ci=stats.median_ci(bm_values) if bm_values else None,
                ratio_ci=ratio_ci,
                overhead_ci=(1 - ratio_ci[1], 1 - ratio_ci[0]) if ratio_ci else None,
                invalid=invalid,
            )
        )
    return BenchmarkComparison(
        name=bench.name,
        kind=bench.kind,
        unit=bench.unit or (base.unit if base else ""),
        higher_is_better=better,
        scenario=bench.scenario,
        scaling=bench.scaling,
        reference_nodes=reference.nodes if reference else None,
        points=compared,
        failed_points=failed,
        has_baseline=base is not None,
    )


def _label(bench: Benchmark, point: Point) -> str:
    return (point_label(bench, point) + (f", mapping {point.network_mapping}" if point.network_mapping else "")
            + (f", {point.data}" if point.data else ""))


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
    """How many times better `value` is than `against` (time figures invert); None when either is
    zero or negative (no figure of a throughput or a time can be)."""
    if against is None or against <= 0 or value <= 0:
        return None
    return value / against if higher_is_better else against / value


def _baseline_key(bench: Benchmark, point: Point) -> tuple[int, ...]:
    # A bare-metal baseline has no VMs: match scaling points by nodes, concurrent ones by GPUs.
    return (point.nodes,) if bench.scenario == "scaling" else (point.nodes, point.gpus_per_node)


def _baseline_values(bench: Benchmark, base: Benchmark | None) -> dict[tuple[int, ...], list[float]]:
    """The baseline's figures by point (an empty list: the baseline's runs there all failed)."""
    if base is None:
        return {}
    return {_baseline_key(bench, p): _values(p) for p in base.points}


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
