"""The benchmark guide's (docs/benchmarks.md) `bench compare` example is what the command prints for the bundled study results."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpuvm.cli import common
from gpuvm.cli.main import app

REPO = Path(__file__).parents[2]
COMMAND = ("bench compare playbooks/results/study-vm --baseline playbooks/results/study-baremetal.yaml "
           "--max-overhead 2%")


def test_the_compare_example_rows_are_the_real_output(monkeypatch):
    guide = (REPO / "docs" / "benchmarks.md").read_text()
    shown = guide.split(f"$ gpuvm {COMMAND}\n", 1)[1].split("```", 1)[0].splitlines()
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(common.out, "_console", None)  # made again at this COLUMNS, not an earlier test's
    result = CliRunner().invoke(app, COMMAND.split(), env={"COLUMNS": "160"})
    assert result.exit_code == 10, result.output  # inconclusive: one published mean per point, no interval
    printed = [line.rstrip() for line in result.output.splitlines()]
    assert len(shown) == 5 and all(row in printed for row in shown), "\n".join(printed)
