"""`gpuvm plan --detailed-exitcode`: the exit code says whether the plan is empty, has changes, or is
incomplete because a target could not be observed (the planning itself mocked)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpuvm import runs
from gpuvm.cli.main import app
from gpuvm.plan import Change, Plan

CHANGE = Change("vm.hardware", "train-01", "vm", "cpus", 4, 8)
DOWN = {"gpu-vm-02": "cannot connect to 10.0.0.12:22"}


@pytest.mark.parametrize("plan, code, says", [
    (Plan(), 0, "No changes. Infrastructure matches the runbook."),
    (Plan(changes=[CHANGE]), 2, "Plan: 1 change(s) on 1 target(s)."),
    (Plan(unobserved=DOWN), 3, "1 target(s) not observed: gpu-vm-02. The plan is incomplete."),
    (Plan(changes=[CHANGE], unobserved=DOWN), 2, "1 target(s) not observed: gpu-vm-02."),
])
def test_detailed_exitcode(mocker, plan, code, says):
    mocker.patch.object(runs, "plan_runbook", return_value=plan)
    result = CliRunner().invoke(app, ["plan", "lab.yaml", "--detailed-exitcode"])
    assert result.exit_code == code, result.output
    assert says in result.output
