"""`gpuvm plan`'s exit code: with --detailed-exitcode it says whether the plan is empty, has changes, or
is incomplete because a target could not be observed; without it, 0 unless the plan is incomplete
(3, as for a target not reached). The planning itself mocked."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpuvm import collector, runs
from gpuvm.cli import common
from gpuvm.cli.main import app
from gpuvm.plan import Change, LeftOut, Plan

CHANGE = Change("vm.hardware", "train-01", "vm", "cpus", 4, 8)
DOWN = {"gpu-vm-02": "cannot connect to 10.0.0.12:22"}


@pytest.mark.parametrize("plan, code, says", [
    (Plan(), 0, "No changes. Infrastructure matches the runbook."),
    (Plan(changes=[CHANGE]), 2, "Plan: 1 change(s) on 1 target(s)."),
    (Plan(unobserved=DOWN), 3, "1 target(s) not observed: gpu-vm-02. The plan is incomplete."),
    (Plan(changes=[CHANGE], unobserved=DOWN), 3, "1 target(s) not observed: gpu-vm-02."),  # worst first
    (Plan(left_out=[LeftOut(CHANGE, "waits on host esx-01 (1 change(s) planned there), not targeted")]), 2,
     "No changes to carry out; 1 change(s) left out on 1 target(s): train-01. The plan is incomplete."),
])
def test_detailed_exitcode(mocker, plan, code, says):
    mocker.patch.object(runs, "plan_runbook", return_value=plan)
    result = CliRunner().invoke(app, ["plan", "lab.yaml", "--detailed-exitcode"])
    assert result.exit_code == code, result.output
    assert says in result.output


@pytest.mark.parametrize("plan, code", [
    (Plan(), 0),
    (Plan(changes=[CHANGE]), 0),
    (Plan(unobserved=DOWN), 3),
    (Plan(changes=[CHANGE], unobserved=DOWN), 3),
    (Plan(left_out=[LeftOut(CHANGE, "waits on host esx-01, not targeted")]), 0),
])
def test_an_incomplete_plan_is_not_a_success(mocker, plan, code):
    mocker.patch.object(runs, "plan_runbook", return_value=plan)
    result = CliRunner().invoke(app, ["plan", "lab.yaml"])
    assert result.exit_code == code, result.output
    assert ("not observed: gpu-vm-02" in result.output) == (code == 3)
    assert ("No changes. Infrastructure matches" in result.output) == (plan.complete and not plan.changes)


def test_target_names_reach_the_library(mocker):
    planned = mocker.patch.object(runs, "plan_runbook", return_value=Plan())
    result = CliRunner().invoke(app, ["plan", "lab.yaml", "--target", "esx-01", "--target", "vm-7"])
    assert result.exit_code == 0, result.output
    assert planned.call_args.args[4] == ["esx-01", "vm-7"]


def test_plan_run_as_the_process_ends_it_after_flushing_with_its_status_leaving_what_it_discarded(mocker, monkeypatch):
    """Issue 27: the console script's `plan` ends the process without the interpreter's teardown
    (gpuvm.collector): the inventory's tree it discarded is kept (not freed), its output and log
    flushed, then the process ends with the plan's exit status."""
    monkeypatch.setattr(collector, "_left", None)
    tree = object()
    mocker.patch.object(runs, "plan_runbook", side_effect=lambda *args: collector.discard(tree) or Plan(changes=[CHANGE]))
    ending = mocker.Mock()
    ending.sys.getprofile.return_value = ending.sys.gettrace.return_value = None  # no profiler, no tracer
    mocker.patch.object(common, "sys", ending.sys)
    mocker.patch.object(common.logging, "shutdown", ending.log)
    mocker.patch.object(common.os, "_exit", ending.exit)
    with pytest.raises(SystemExit):  # typer's own end, after the mocked os._exit returned
        app(["plan", "lab.yaml", "--detailed-exitcode"])
    calls = [name for name, *_ in ending.mock_calls if name not in ("sys.getprofile", "sys.gettrace")]
    assert calls == ["log", "sys.stdout.flush", "sys.stderr.flush", "exit"]
    ending.exit.assert_called_once_with(2)
    assert collector._left == [tree]


def test_plan_under_a_profiler_ends_as_typer_does_so_the_profile_is_written(mocker, monkeypatch):
    monkeypatch.setattr(collector, "_left", None)
    mocker.patch.object(runs, "plan_runbook", side_effect=lambda *args: Plan(changes=[CHANGE]))
    mocker.patch.object(common.sys, "getprofile", return_value=object())  # cProfile's, say
    mocker.patch.object(common.os, "_exit", side_effect=AssertionError("ended under the profiler"))
    with pytest.raises(SystemExit) as ended:
        app(["plan", "lab.yaml", "--detailed-exitcode"])
    assert ended.value.code == 2


def test_plan_run_inside_a_caller_ends_as_typer_does_and_frees_what_it_discarded(mocker, monkeypatch):
    """The same command through CliRunner (a test, a caller's process): nothing kept, no os._exit."""
    monkeypatch.setattr(collector, "_left", None)
    mocker.patch.object(runs, "plan_runbook", side_effect=lambda *args: collector.discard(object()) or Plan())
    mocker.patch.object(common.os, "_exit", side_effect=AssertionError("the caller's process ended"))
    result = CliRunner().invoke(app, ["plan", "lab.yaml"])
    assert result.exit_code == 0, result.output
    assert not collector.leaving()
