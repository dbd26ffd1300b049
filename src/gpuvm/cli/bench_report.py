"""`gpuvm bench compare` and `gpuvm bench report`: thin commands over gpuvm.bench."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuvm.cli.common import fail, handle_errors, out
from gpuvm.errors import InputError

ResultsArg = Annotated[
    list[Path],
    typer.Argument(help="Results directories (or results.json files, YAML baselines); several are compared "
                        "side by side, each a setup.", show_default=False),
]
BaselineOpt = Annotated[
    Path | None,
    typer.Option("--baseline", "-b", help="Results to compare against (e.g. bare metal)."),
]


def register(app: typer.Typer) -> None:
    """Add `compare` and `report` to the `bench` sub-app."""
    app.command("compare")(compare_command)
    app.command("report")(report_command)


@handle_errors
def compare_command(
    results: ResultsArg,
    baseline: BaselineOpt = None,
    max_overhead: Annotated[
        str | None,
        typer.Option(
            help="Fail (exit 1) when overhead against the baseline exceeds this: 2% or 0.02."
        ),
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON (schema gpuvm.bench-compare/1).")] = False,
) -> None:
    """Print medians, spread, scaling and VM-vs-baseline overhead for results (several: side by side)."""
    from dataclasses import asdict

    from gpuvm.bench.compare import compare
    from gpuvm.bench.report import render_terminal
    from gpuvm.documents import document, dumps

    limit = parse_fraction(max_overhead) if max_overhead is not None else None
    comparison = compare(*_load(results, baseline), max_overhead=limit)
    if json_:
        print(dumps(document("bench-compare", **asdict(comparison))))
    else:
        out.print(render_terminal(comparison))
    if comparison.violations:
        lines = "\n  ".join(str(v) for v in comparison.violations)
        raise fail(f"overhead above {max_overhead}:\n  {lines}", 1)


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
) -> None:
    """Write a Markdown and a self-contained HTML report with plots, and print the table."""
    from gpuvm.bench.compare import compare
    from gpuvm.bench.report import render_terminal, write_report

    comparison = compare(*_load(results, baseline))
    first = results[0]
    out_dir = out_dir or (first if first.is_dir() else first.parent) / "report"
    try:
        written = write_report(comparison, out_dir)
    except OSError as e:
        raise InputError(f"{out_dir}: cannot write the report: {e.strerror or e}") from None
    out.print(render_terminal(comparison))
    out.print("wrote:", highlight=False, markup=False)
    for path in written:
        out.print(f"  {path}", highlight=False, markup=False, soft_wrap=True)


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
