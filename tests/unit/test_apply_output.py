"""apply's text output: a progress or skipped line is one line, however long (the terminal wraps it;
a pipe or a log keeps it whole for grep)."""

from __future__ import annotations

from gpuvm.cli.apply_output import ApplyOutput


def test_a_long_failure_or_skip_stays_on_one_line(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    reason = "ReconfigVM failed: " + "a fault vCenter explains at length " * 8
    ApplyOutput(False, "text").progress("vm.hardware", "vm1", f"failed: {reason}")
    [line] = capsys.readouterr().err.splitlines()
    assert line.rstrip().endswith(reason.rstrip()) and "vm1" in line
