"""The benchmark guide's (docs/benchmarks.md) worked sizing example (the study's cluster: ResNet-50, 4 x A100 80GB, batch 1024 per
GPU, mixed precision) is what `gpuvm size` prints: every number it shows, row by row."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from gpuvm.cli import common
from gpuvm.cli.main import app

REPO = Path(__file__).parents[2]
COMMAND = "size --model resnet50 --precision fp16 --batch-per-gpu 1024 --gpus 4 --gpu a100-80gb"
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _shown() -> list[str]:
    guide = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert f"$ gpuvm {COMMAND}\n" in guide, "docs/benchmarks.md no longer shows the worked example's command"
    return guide.split(f"$ gpuvm {COMMAND}\n", 1)[1].split("```", 1)[0].splitlines()


def _rows(lines: list[str]) -> dict[str, str]:
    """Table rows by their first cell, with the text of a wrapped row's continuation lines joined;
    header rows too (by their joined cells)."""
    rows: dict[str, list[str]] = {}
    label = None
    for line in lines:
        line = line.strip()
        if line.startswith("┃"):
            cells = [c.strip() for c in line.strip("┃").split("┃")]
            rows[" | ".join(cells)] = []
        elif line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            if cells[0]:
                label = cells[0]
                rows[label] = cells[1:]
            elif label is not None:  # a wrapped row: its cells go on
                rows[label] = [f"{a} {b}".strip() for a, b in zip(rows[label], cells[1:])]
    return {k: " | ".join(v) for k, v in rows.items()}


def test_the_size_example_is_the_real_output(monkeypatch):
    shown = _shown()
    monkeypatch.setattr(common.out, "_console", None)  # made again at this COLUMNS, not an earlier test's
    result = CliRunner().invoke(app, COMMAND.split(), env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    printed = [line.rstrip() for line in result.output.splitlines()]

    # the figures the example is about are there (an example cut down by mistake fails here)
    shown_rows = _rows(shown)
    for label in ("weights", "optimizer state", "activations", "total", "smallest GPU count (a100-80gb, 80 GiB)",
                  "throughput (one job)", "storage must deliver", "reads in flight", "checkpoint write rate", "epoch"):
        assert label in shown_rows, label

    # every row of the example's tables holds the numbers the command prints in that row
    printed_rows = _rows(printed)
    for label, text in shown_rows.items():
        assert label in printed_rows, f"example row {label!r} not printed:\n" + "\n".join(printed)
        assert NUMBER.findall(text) == NUMBER.findall(printed_rows[label]), (label, text, printed_rows[label])

    # the lines outside the tables (title, assumptions) are printed as the example shows them
    for line in shown:
        if line.strip() and line.strip()[0] not in "┏┃┡│└" and not line.startswith(("Memory per GPU", "Rates")):
            assert line.rstrip() in printed, line

    # and, whatever the layout, every number the example shows is in the output
    output = result.output
    for number in NUMBER.findall("\n".join(shown)):
        assert re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", output), number


def test_the_readme_sizing_rows_are_the_real_output(monkeypatch):
    """README's before-buying example: each row it shows is a row `gpuvm size` prints, at 100 columns."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = "size --model resnet50 --precision bf16 --batch-per-gpu 256 --gpu h200"
    assert f"$ gpuvm {command}\n" in readme
    shown = [line for line in readme.split(f"$ gpuvm {command}\n", 1)[1].split("```", 1)[0].splitlines() if line]
    monkeypatch.setattr(common.out, "_console", None)
    result = CliRunner().invoke(app, command.split(), env={"COLUMNS": "100"})
    printed = [line.rstrip() for line in result.output.splitlines()]
    assert len(shown) >= 3 and all(line in printed for line in shown), "\n".join(printed)
