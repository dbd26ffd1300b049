"""The bad-input corpus: every broken runbook exits 2 with one message naming file, line and field.

Each `tests/fixtures/bad_runbooks/NN-name.yaml` has a `.expect` regex beside it. They are planned
offline against a snapshot of the simulator's lab (`tests/fixtures/inventory/lab.json`), so the
checks that need the inventory (missing devices, profiles not offered) run too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app

FIXTURES = Path(__file__).parents[1] / "fixtures"
CORPUS = sorted((FIXTURES / "bad_runbooks").glob("*.yaml"))
SNAPSHOT = FIXTURES / "inventory" / "lab.json"


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 50


@pytest.mark.parametrize("runbook", CORPUS, ids=[p.stem for p in CORPUS])
def test_bad_runbook_is_one_clear_error(runbook, monkeypatch):
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", "unused")
    expected = runbook.with_suffix(".expect").read_text().strip()
    result = CliRunner().invoke(app, ["plan", str(runbook), "--snapshot", str(SNAPSHOT)])
    output = result.output
    assert result.exit_code == 2, output
    assert "Traceback" not in output and result.exception is None or isinstance(result.exception, SystemExit)
    first = output.strip().splitlines()[0]
    assert first.startswith(f"error: {runbook}:"), first
    assert re.search(r"^error: \S+:\d+: ", first), first  # file:line
    assert re.search(expected, output), f"{expected!r} not in {output!r}"
