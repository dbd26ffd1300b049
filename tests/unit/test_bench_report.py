"""The terminal table, the report files, and the `bench compare` / `bench report` commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from gpuvm.bench.compare import compare
from gpuvm.bench.report import render_terminal, table_rows, write_report
from gpuvm.bench.results import load_results
from gpuvm.cli.bench_report import parse_fraction
from gpuvm.errors import InputError
from tests.unit.factories import bench_cli

REPO = Path(__file__).parents[2]
STUDY_VM = REPO / "playbooks" / "results" / "study-vm"
STUDY_BM = REPO / "playbooks" / "results" / "study-baremetal.yaml"
STUDY_NUMBERS = ("1.956", "3.872", "97.8", "96.8", "98.7")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def study():
    return compare(load_results(STUDY_VM), load_results(STUDY_BM))


@pytest.fixture
def cli():
    return bench_cli()


def test_terminal_table_shows_study_numbers(study):
    console = Console(width=200, record=True)
    console.print(render_terminal(study))
    text = console.export_text()
    for number in STUDY_NUMBERS:
        assert number in text
    assert "VM / BM" in text and "Bare metal" in text and "weak scaling" in text


def test_rows_format_speedup_with_3_decimals_and_percentages_with_1(study):
    four = next(r for r in table_rows(study) if r.cells[1] == "4 nodes")
    assert four.cells[6:] == ("3.872", "96.8%", "10,818.0", "98.7%", "1.3%")


def test_write_report(study, tmp_path):
    written = write_report(study, tmp_path / "out")
    names = {p.name for p in written}
    assert {"report.md", "report.html"} <= names
    assert {"resnet50-scaling-throughput.png", "resnet50-scaling-efficiency.png",
            "resnet50-scaling-vs-baseline.png", "resnet50-concurrent-concurrent.png"} <= names  # fmt: skip
    for path in written:
        assert path.is_file()
        if path.suffix == ".png":
            assert path.read_bytes().startswith(PNG_MAGIC)
    html = (tmp_path / "out" / "report.html").read_text()
    markdown = (tmp_path / "out" / "report.md").read_text()
    for number in STUDY_NUMBERS:
        assert number in html and number in markdown
    assert html.count('<img src="data:image/png;base64,') == 4
    # self-contained: no external scripts, stylesheets or images
    assert not re.search(r'(src|href)="(?!data:)', html)
    assert "![resnet50-scaling: throughput vs nodes](resnet50-scaling-throughput.png)" in markdown


def test_report_without_baseline_has_no_baseline_plot(tmp_path):
    written = write_report(compare(load_results(STUDY_VM)), tmp_path)
    assert not any("vs-baseline" in p.name for p in written)


def test_report_states_the_verdict_the_study_supports(tmp_path):
    """One published mean per point: 1.3 % against a 1 % limit is no evidence either way."""
    comparison = compare(load_results(STUDY_VM), load_results(STUDY_BM), max_overhead=0.01)
    write_report(comparison, tmp_path)
    markdown = (tmp_path / "report.md").read_text()
    assert "Verdict: **inconclusive**" in markdown
    assert ("resnet50-scaling at 4 nodes: VM within 1.0 % of bare metal: inconclusive — overhead 1.3 % "
            "(no interval: 1 repeat each, 3 needed)") in markdown
    assert "resnet50-scaling: no intervals (1 repeat per point; 3 needed)." in markdown


@pytest.mark.parametrize(
    "text, value", [("2%", 0.02), ("0.02", 0.02), (" 1.5% ", 0.015), ("0", 0.0)]
)
def test_parse_fraction(text, value):
    assert parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["2", "abc", "-1%", "100%", ""])
def test_parse_fraction_rejects(text):
    with pytest.raises(InputError, match="--max-overhead"):
        parse_fraction(text)


# ------------------------------------------------------------------------------------------ CLI


def test_cli_compare_prints_study_numbers(cli):
    result = cli("compare", STUDY_VM, "--baseline", STUDY_BM)
    assert result.exit_code == 0, result.output
    for number in STUDY_NUMBERS:
        assert number in result.output


def test_cli_compare_study_against_a_limit_is_inconclusive(cli):
    """The study published one mean per point: no interval, so neither 2 % nor 1 % can be claimed."""
    for limit in ("2%", "0.01"):
        result = cli("compare", STUDY_VM, "--baseline", STUDY_BM, "--max-overhead", limit)
        assert result.exit_code == 10, result.output
        assert "error: inconclusive: the data cannot tell whether resnet50-scaling at 4 nodes is within" in result.output
        assert "inconclusive — overhead 1.3 % (no interval: 1 repeat each, 3 needed)" in result.output


def test_cli_report(cli, tmp_path):
    result = cli("report", STUDY_VM, "--baseline", STUDY_BM, "--out", tmp_path / "rep")
    assert result.exit_code == 0, result.output
    for number in STUDY_NUMBERS:
        assert number in result.output
    assert str(tmp_path / "rep" / "report.html") in result.output
    assert (tmp_path / "rep" / "report.md").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (("compare", "/nonexistent/results"), "error: /nonexistent/results: no such file"),
        (("compare", STUDY_VM, "--max-overhead", "two"), "error: --max-overhead 'two'"),
        (("compare", STUDY_VM, "--max-overhead", "2%"), "error: --max-overhead needs --baseline"),
        (("report", STUDY_VM, "--baseline", "/nonexistent.yaml"), "error: /nonexistent.yaml"),
    ],
)
def test_cli_errors_are_one_line_with_exit_2(cli, args, message):
    result = cli(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
