"""`gpuvm bench compare` and `gpuvm bench report`: thin commands over gpuvm.bench."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuvm.cli.common import escape, fail, handle_errors, out
from gpuvm.errors import InputError, listed

ResultsArg = Annotated[
    list[Path],
    typer.Argument(help="Results directories (or results.json files, YAML baselines); several are compared "
                        "side by side, each a setup.", show_default=False),
]
BaselineOpt = Annotated[
    Path | None,
    typer.Option("--baseline", "-b", help="Results to compare against (e.g. bare metal)."),
]


MaxOverheadOpt = Annotated[
    str | None,
    typer.Option(
        help="Check the overhead against the baseline: 2% or 0.02. Each point's verdict is pass (its whole "
             "95 % interval is within), fail (wholly beyond; exit 9) or inconclusive (the interval straddles "
             "it, or fewer than 3 repeats; exit 10). A point without a valid figure fails."
    ),
]


def register(app: typer.Typer) -> None:
    """Add `compare` and `report` to the `bench` sub-app."""
    app.command("compare")(compare_command)
    app.command("report")(report_command)


@handle_errors
def compare_command(
    results: ResultsArg,
    baseline: BaselineOpt = None,
    max_overhead: MaxOverheadOpt = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON (schema gpuvm.bench-compare/2).")] = False,
) -> None:
    """Print medians with 95 % intervals, spread, scaling and VM-vs-baseline overhead for results
    (several: side by side); with --max-overhead, a verdict per point and an exit code that tells it."""
    from dataclasses import asdict

    from gpuvm.bench.compare import compare
    from gpuvm.bench.report import render_terminal
    from gpuvm.documents import document, dumps

    limit = _limit(max_overhead, baseline)
    comparison = compare(*_load(results, baseline), max_overhead=limit)
    if json_:
        print(dumps(document("bench-compare", **asdict(comparison), verdict=comparison.verdict,
                             violations=[asdict(v) for v in comparison.violations])))
    else:
        out.print(render_terminal(comparison))
        _print_verdicts(comparison)
    _exit_for_verdict(comparison, max_overhead)


def _limit(max_overhead: str | None, baseline: Path | None) -> float | None:
    if max_overhead is None:
        return None
    limit = parse_fraction(max_overhead)
    if baseline is None:
        raise InputError("--max-overhead needs --baseline: the figures to measure the overhead against")
    return limit


def _print_verdicts(comparison: Any) -> None:
    if comparison.max_overhead is None:
        return
    for verdict in comparison.verdicts:
        colour = {"pass": "green", "fail": "red"}.get(verdict.outcome, "yellow")
        out.print(f"[{colour}]{escape(str(verdict))}[/]", highlight=False, markup=True, soft_wrap=True)


def _exit_for_verdict(comparison: Any, max_overhead: str | None) -> None:
    """Exit 9 when a point fails the limit, 10 when one is inconclusive (or none could be checked)."""
    from gpuvm.bench.compare import VERDICT_EXIT_CODES

    verdict = comparison.verdict
    if verdict in (None, "pass"):
        return
    if not comparison.verdicts:
        raise fail(f"inconclusive: no point has both a figure and a baseline figure to check against "
                   f"{max_overhead}", VERDICT_EXIT_CODES["inconclusive"])
    if verdict == "fail":
        names = [f"{v.benchmark} at {v.point}" for v in comparison.violations]
        raise fail(f"fail: {listed(names)} beyond {max_overhead} (or without a valid figure)", VERDICT_EXIT_CODES["fail"])
    names = [f"{v.benchmark} at {v.point}" for v in comparison.verdicts if v.outcome == "inconclusive"]
    raise fail(f"inconclusive: the data cannot tell whether {listed(names)} "
               f"{'is' if len(names) == 1 else 'are'} within {max_overhead}; run more repeats "
               "(a higher `repeats`; with `repeats: auto`, a higher `repeats_max`, where it stops)",
               VERDICT_EXIT_CODES["inconclusive"])


@handle_errors
def report_command(
    results: ResultsArg,
    baseline: BaselineOpt = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Directory for report.md, report.html and plots. [default: the first RESULTS/report]",
        ),
    ] = None,
    max_overhead: MaxOverheadOpt = None,
) -> None:
    """Write a Markdown and a self-contained HTML report with plots (error bars: 95 % intervals), and
    print the table; with --max-overhead, the verdicts too (and the exit code of `compare`)."""
    from gpuvm.bench.compare import compare
    from gpuvm.bench.report import render_terminal, write_report
    from gpuvm.files import writing

    comparison = compare(*_load(results, baseline), max_overhead=_limit(max_overhead, baseline))
    first = results[0]
    out_dir = out_dir or (first if first.is_dir() else first.parent) / "report"
    with writing(out_dir, "the report"):
        written = write_report(comparison, out_dir)
    out.print(render_terminal(comparison))
    out.print("wrote:", highlight=False, markup=False)
    for path in written:
        out.print(f"  {path}", highlight=False, markup=False, soft_wrap=True)
    _print_verdicts(comparison)
    _exit_for_verdict(comparison, max_overhead)


def parse_fraction(text: str) -> float:
    """`2%` → 0.02, `0.02` → 0.02; anything else is an InputError."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise InputError(
            f"--max-overhead {text!r}: expected a percentage such as 2% or a fraction such as 0.02"
        )
    return value


def _load(results: list[Path], baseline: Path | None):
    from gpuvm.bench.results import load_results, merge_results

    names = [_name(path) for path in results]
    if len(set(names)) != len(names):  # same directory names under different parents
        names = [f"{path.resolve().parent.name}/{name}" for path, name in zip(results, names, strict=True)]
    if len(set(names)) != len(names):
        raise InputError(f"results named alike ({', '.join(names)}): give each results directory once")
    named = [(name, load_results(path)) for name, path in zip(names, results, strict=True)]
    return merge_results(named), load_results(baseline) if baseline else None


def _name(path: Path) -> str:
    """A results set's name: its directory's (`results.json` names its parent)."""
    if not path.is_dir() and path.name == "results.json":
        path = path.parent
    return path.name if path.is_dir() else path.stem
