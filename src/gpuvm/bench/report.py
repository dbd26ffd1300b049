"""Turn a `Comparison` into a terminal table, Markdown, self-contained HTML and PNG plots.

Every rendering starts from `table_rows`, so the terminal, Markdown and HTML tables always show
the same cells. Speedups print with 3 decimals, percentages with 1.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpuvm.bench import stats
from gpuvm.bench.compare import BenchmarkComparison, Comparison, PointComparison
from gpuvm.secrets import redact
from gpuvm.templating import environment

if TYPE_CHECKING:
    from rich.table import Table

TEMPLATE_NAMES = ("report.md.j2", "report.html.j2")


@dataclass(frozen=True)
class Row:
    cells: tuple[str, ...]
    sub: bool = False  # a per-VM line under a concurrent point
    violation: bool = False  # overhead above the limit
    first: bool = False  # first row of a benchmark


# ------------------------------------------------------------------------------------ formatting


def fmt_value(value: float | None) -> str:
    if value is None:
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.1f}"
    if abs(value) >= 10:
        return f"{value:.2f}"
    return f"{value:.3f}"


def fmt_speedup(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def fmt_percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def has_setups(comparison: Comparison) -> bool:
    return any(p.setup for b in comparison.benchmarks for p in b.points)


def columns(comparison: Comparison) -> tuple[str, ...]:
    base = comparison.baseline_environment
    base_name = "Bare metal" if base == "bare-metal" else "Baseline"
    ratio = "VM / BM" if (comparison.environment, base) == ("vm", "bare-metal") else "Ratio"
    setup = ("Setup",) if has_setups(comparison) else ()
    return (
        "Benchmark", *setup, "Point", "Runs", "Median", "Min – max", "Stdev",
        "Speedup", "Efficiency", base_name, ratio, "Overhead",
    )  # fmt: skip


def _benchmark_cell(bench: BenchmarkComparison) -> str:
    kind = f"{bench.scaling} scaling" if bench.scaling else bench.scenario
    better = "" if bench.higher_is_better else ", lower is better"
    return f"{bench.name}\n({kind}, {bench.unit or 'no unit'}{better})"


def table_rows(comparison: Comparison) -> list[Row]:
    """The cells of the comparison table, one row per point (and per VM for concurrent points)."""
    failing = {(v.benchmark, v.point) for v in comparison.violations}
    setups = has_setups(comparison)
    rows: list[Row] = []
    for bench in comparison.benchmarks:
        for i, point in enumerate(bench.points):
            s = point.spread
            new_setup = i == 0 or point.setup != bench.points[i - 1].setup
            setup = ((point.setup or "—") if new_setup else "",) if setups else ()
            rows.append(
                Row(
                    cells=(
                        _benchmark_cell(bench) if i == 0 else "",
                        *setup,
                        point.label,
                        str(s.repeats),
                        fmt_value(point.total if point.total is not None else s.median),
                        "—" if s.repeats < 2 else f"{fmt_value(s.min)} – {fmt_value(s.max)}",
                        fmt_value(s.stdev),
                        fmt_speedup(point.speedup),
                        fmt_percent(point.efficiency),
                        fmt_value(point.baseline),
                        fmt_percent(point.ratio),
                        fmt_percent(point.overhead),
                    ),
                    violation=(bench.name, point.label) in failing,
                    first=i == 0,
                )
            )
            if point.per_vm and (point.vms > 1 or len(point.per_vm) > 1):
                for vm, value in point.per_vm.items():
                    blank = ("",) * 7
                    rows.append(
                        Row(cells=("", *(("",) if setups else ()), f"  └ {vm}", "", fmt_value(value), *blank),
                            sub=True)
                    )
    return rows


def notes(comparison: Comparison) -> list[str]:
    """Lines under the table: where figures come from and how speedup was measured."""
    lines = []
    if comparison.note:
        lines.append(f"Results: {comparison.note}")
    if comparison.baseline_note:
        lines.append(f"Baseline: {comparison.baseline_note}")
    lines.extend(f"Warning: environments differ: {w}." for w in comparison.environment_warnings)
    for bench in comparison.benchmarks:
        if bench.reference_nodes not in (None, 1):
            lines.append(
                f"{bench.name}: speedup is relative to {bench.reference_nodes} nodes "
                "(no 1-node point)."
            )
        if any(p.per_vm for p in bench.points):
            lines.append(f"{bench.name}: concurrent points show the sum of the per-VM medians.")
        gains = [p for p in bench.points if p.mapping_gain is not None]
        if gains:
            lines.append(f"{bench.name}: network mapping on against off: " + ", ".join(
                f"{p.label.removesuffix(', mapping on')}{f' ({p.setup})' if p.setup else ''} "
                f"{p.mapping_gain * 100:+.1f}%" for p in gains) + ".")
        reads = [p for p in bench.points if p.data_overhead is not None]
        if reads:
            lines.append(f"{bench.name}: data path overhead (files against synthetic data): " + ", ".join(
                f"{p.label.removesuffix(', files')}{f' ({p.setup})' if p.setup else ''} "
                f"{fmt_percent(p.data_overhead)}" for p in reads) + ".")
    return lines + uncertainty(comparison)


def fmt_interval(interval: tuple[float, float] | None, fmt=fmt_value) -> str:
    return "" if interval is None else f"{fmt(interval[0])}–{fmt(interval[1])}"


def uncertainty(comparison: Comparison) -> list[str]:
    """What the repeats say about each figure: its 95 % interval (or why there is none), the
    intervals of speedup, efficiency and overhead, outliers, drift, runs that failed."""
    level = f"{stats.LEVEL * 100:.0f} % CI"
    lines = []
    for bench in comparison.benchmarks:
        if bench.points and all(p.spread.ci is None for p in bench.points):
            most = max(p.spread.repeats for p in bench.points)
            lines.append(f"{bench.name}: no intervals ({'1 repeat' if most == 1 else f'at most {most} repeats'} "
                         f"per point; {stats.MIN_REPEATS} needed).")
        for p in bench.points:
            s = p.spread
            parts = []
            if s.ci is not None:
                parts.append(f"median {fmt_value(s.median)} ({level} {fmt_interval(s.ci)}, {s.repeats} repeats)")
            if p.speedup_ci is not None:
                parts.append(f"speedup {fmt_speedup(p.speedup)} ({fmt_interval(p.speedup_ci, fmt_speedup)})")
            if p.efficiency_ci is not None:
                parts.append(f"efficiency {fmt_percent(p.efficiency)} ({fmt_interval(p.efficiency_ci, fmt_percent)})")
            if p.overhead_ci is not None:
                parts.append(f"overhead {fmt_percent(p.overhead)} ({fmt_interval(p.overhead_ci, fmt_percent)})")
            if s.outliers:
                parts.append(f"outlier repeat{'s' if len(s.outliers) > 1 else ''} {', '.join(map(str, s.outliers))} "
                             "(modified z-score above 3.5; kept)")
            if s.drift is not None:
                parts.append(f"drift {s.drift * 100:+.1f}% from the first to the last half of the repeats")
            if s.failed:
                parts.append(f"{s.failed} of {s.failed + s.repeats} runs failed")
            if s.warmups and parts:
                parts.append(f"after {s.warmups} warm-up run{'s' if s.warmups > 1 else ''} (excluded)")
            if parts:
                lines.append(f"{bench.name} at {p.label}: " + "; ".join(parts) + ".")
        lines.extend(f"{bench.name} at {f.label}: no figure: {'the' if f.runs == 1 else f'all {f.runs}'} "
                     f"run{'s' if f.runs != 1 else ''} failed ({f.error})." for f in bench.failed_points)
    return lines


# -------------------------------------------------------------------------------------- terminal


def render_terminal(comparison: Comparison) -> Table:
    """The comparison as one rich Table; `compare` and `report` both print this."""
    from gpuvm.render import table

    title = f"Results ({comparison.environment})"
    if comparison.baseline_environment:
        title += f" against baseline ({comparison.baseline_environment})"
    rows = table_rows(comparison)
    return table(title, columns(comparison), [row.cells for row in rows], caption="\n".join(notes(comparison)) or None,
                 numbers_from=3 if has_setups(comparison) else 2, styles=["red" if row.violation else ("dim" if row.sub else None) for row in rows],
                 sections=[i for i, row in enumerate(rows) if row.first])


# ---------------------------------------------------------------------------------------- report


def write_report(comparison: Comparison, out_dir: Path | str) -> list[Path]:
    """Write report.md, a self-contained report.html and the PNG plots; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = _templates()
    plots = write_plots(comparison, out)
    context = {
        "title": "gpuvm benchmark report",
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "comparison": comparison,
        "columns": columns(comparison),
        "text_columns": 3 if has_setups(comparison) else 2,  # then numbers, right-aligned
        "rows": table_rows(comparison),
        "notes": notes(comparison),
        "violations": [str(v) for v in comparison.violations],
        "verdict": comparison.verdict,
        "verdicts": [{"outcome": v.outcome, "text": str(v)} for v in comparison.verdicts],
        "max_overhead": fmt_percent(comparison.max_overhead)
        if comparison.max_overhead is not None
        else None,
        "plots": [
            {"title": title, "file": path.name, "data_uri": _data_uri(path)}
            for title, path in plots
        ],
    }
    written = []
    for name in TEMPLATE_NAMES:
        path = out / name.removesuffix(".j2")
        # results.json is masked when written; a results file from elsewhere is masked here
        path.write_text(redact(env.get_template(name).render(context)), encoding="utf-8")
        written.append(path)
    return written + [path for _, path in plots]


def _templates():
    from jinja2 import StrictUndefined

    return environment(
        autoescape=lambda name: bool(name and name.endswith(".html.j2")),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


# ----------------------------------------------------------------------------------------- plots


def write_plots(comparison: Comparison, out: Path) -> list[tuple[str, Path]]:
    """PNG plots (matplotlib, Agg): throughput and efficiency against nodes, VM vs bare metal."""
    plots: list[tuple[str, Path]] = []
    for bench in comparison.benchmarks:
        slug = plot_stem(bench.name)
        if bench.scenario == "scaling" and len(bench.points) >= 2:
            plots.append((f"{bench.name}: {_quantity(bench)} vs nodes",
                          _throughput_plot(bench, out / f"{slug}-throughput.png")))  # fmt: skip
            plots.append((f"{bench.name}: scaling efficiency",
                          _efficiency_plot(bench, out / f"{slug}-efficiency.png")))  # fmt: skip
        if bench.scenario == "concurrent":
            plots.append((f"{bench.name}: concurrent VMs",
                          _concurrent_plot(bench, out / f"{slug}-concurrent.png")))  # fmt: skip
        if any(p.baseline is not None for p in bench.points):
            label = (
                "VM vs bare metal"
                if comparison.baseline_environment == "bare-metal"
                else "vs baseline"
            )
            plots.append((f"{bench.name}: {label}",
                          _baseline_plot(comparison, bench, out / f"{slug}-vs-baseline.png")))  # fmt: skip
    return plots


MAX_STEM = 60  # characters of a benchmark's name a plot's file name keeps


def plot_stem(name: str) -> str:
    """A file name stem for a benchmark's plots: its name when that is a short plain name, else its
    plain characters cut to MAX_STEM and a digest of the whole name ("a b" and "a/b" differ)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:MAX_STEM] or "benchmark"
    if slug == name:
        return slug
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def _errors(centres: list[float], intervals: list[tuple[float, float] | None]) -> list[list[float]]:
    """matplotlib's asymmetric `yerr` (below, above) for each centre; 0 where there is no interval."""
    below = [c - i[0] if i else 0.0 for c, i in zip(centres, intervals, strict=True)]
    above = [i[1] - c if i else 0.0 for c, i in zip(centres, intervals, strict=True)]
    return [[max(b, 0.0) for b in below], [max(a, 0.0) for a in above]]


def _quantity(bench: BenchmarkComparison) -> str:
    return "throughput" if bench.higher_is_better else "time"


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path


def _groups(bench: BenchmarkComparison) -> dict[str, list[PointComparison]]:
    """The points of each setup, network mapping and data, named for a plot's legend."""
    groups: dict[str, list[PointComparison]] = {}
    for p in bench.points:
        name = " · ".join(x for x in (p.setup, f"mapping {p.mapping}" if p.mapping else None, p.data) if x)
        groups.setdefault(name, []).append(p)
    return groups


def _throughput_plot(bench: BenchmarkComparison, path: Path) -> Path:
    figure, ax = _figure()
    groups = _groups(bench)
    for name, points in groups.items():
        nodes = [p.nodes for p in points]
        medians = [p.spread.median for p in points]
        ref, ref_gpus = points[0].spread.median, points[0].nodes * points[0].gpus_per_node
        scale = [(p.nodes * p.gpus_per_node) / ref_gpus for p in points]
        ideal = [ref * s if bench.higher_is_better else ref / s for s in scale]
        ax.plot(nodes, ideal, "--", color="grey", label="ideal (linear)" if len(groups) == 1 else None)
        ax.errorbar(nodes, medians, yerr=_errors(medians, [p.spread.ci for p in points]), marker="o", capsize=4,
                    label=f"{name + ': ' if name else ''}median (95 % CI)")
    ax.set_xlabel("nodes")
    ax.set_ylabel(bench.unit or "value")
    ax.set_xticks(sorted({p.nodes for p in bench.points}))
    ax.set_title(f"{bench.name}: {_quantity(bench)}")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(figure, path)


def _efficiency_plot(bench: BenchmarkComparison, path: Path) -> Path:
    figure, ax = _figure()
    ax.axhline(100, linestyle="--", color="grey", label="ideal")
    every = [0.0]
    for name, points in _groups(bench).items():
        nodes = [p.nodes for p in points]
        efficiency = [(p.efficiency or 0) * 100 for p in points]
        every += efficiency
        label = f"{bench.scaling or ''} scaling efficiency".strip()
        errors = _errors(efficiency, [(p.efficiency_ci[0] * 100, p.efficiency_ci[1] * 100) if p.efficiency_ci
                                      else None for p in points])
        every += [e + above for e, above in zip(efficiency, errors[1], strict=True)]
        ax.errorbar(nodes, efficiency, yerr=errors, marker="o", capsize=4,
                    label=f"{name}: {label} (95 % CI)" if name else f"{label} (95 % CI)")
        for x, y in zip(nodes, efficiency, strict=True):
            ax.annotate(f"{y:.1f}%", (x, y), textcoords="offset points", xytext=(0, -14), ha="center")
    ax.set_xlabel("nodes")
    ax.set_ylabel("efficiency (%)")
    ax.set_xticks(sorted({p.nodes for p in bench.points}))
    ax.set_ylim(0, max(110, max(every) + 10))
    ax.set_title(f"{bench.name}: efficiency")
    ax.legend(loc="lower left")
    ax.grid(alpha=0.3)
    return _save(figure, path)


def _concurrent_plot(bench: BenchmarkComparison, path: Path) -> Path:
    figure, ax = _figure()
    labels = [f"{p.setup}\n{p.label}" if p.setup else p.label for p in bench.points]
    bottoms = [0.0] * len(bench.points)
    slots = max((len(p.per_vm or {}) for p in bench.points), default=0)
    if slots:
        for slot in range(slots):
            heights = [
                list((p.per_vm or {}).values())[slot] if slot < len(p.per_vm or {}) else 0.0
                for p in bench.points
            ]
            ax.bar(labels, heights, bottom=bottoms, label=f"VM {slot + 1}")
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        ax.legend()
    else:
        bottoms = [p.spread.median for p in bench.points]
        ax.bar(labels, bottoms)
    for x, total in enumerate(bottoms):
        ax.annotate(
            fmt_value(total), (x, total), textcoords="offset points", xytext=(0, 3), ha="center"
        )
    ax.set_ylim(0, max(bottoms, default=1) * 1.12 or 1)
    ax.set_ylabel(bench.unit or "value")
    ax.set_title(f"{bench.name}: total across VMs")
    return _save(figure, path)


def _baseline_plot(comparison: Comparison, bench: BenchmarkComparison, path: Path) -> Path:
    figure, ax = _figure()
    points = [p for p in bench.points if p.baseline is not None]
    xs = range(len(points))
    width = 0.38
    medians = [p.spread.median for p in points]
    ax.bar([x - width / 2 for x in xs], medians, width, yerr=_errors(medians, [p.spread.ci for p in points]),
           capsize=4, label=f"{comparison.environment} (95 % CI)")
    baselines = [p.baseline or 0.0 for p in points]
    ax.bar([x + width / 2 for x in xs], baselines, width, yerr=_errors(baselines, [p.baseline_ci for p in points]),
           capsize=4, label=comparison.baseline_environment or "baseline")  # fmt: skip
    for x, p in zip(xs, points, strict=True):
        top = max(p.spread.median, p.baseline or 0)
        ax.annotate(
            f"{fmt_percent(p.ratio)}",
            (x, top),
            textcoords="offset points",
            xytext=(0, 3),
            ha="center",
        )
    ax.set_xticks(list(xs), [p.label for p in points])
    ax.set_ylabel(bench.unit or "value")
    ax.set_title(f"{bench.name}: {comparison.environment} vs {comparison.baseline_environment}")
    tops = [max(p.spread.ci[1] if p.spread.ci else p.spread.median, p.baseline_ci[1] if p.baseline_ci else p.baseline or 0)
            for p in points]
    ax.set_ylim(0, max(tops) * 1.2 or 1)
    ax.legend(loc="upper right", ncol=2)
    return _save(figure, path)
