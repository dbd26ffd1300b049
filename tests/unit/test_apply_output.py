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


def test_a_guest_that_did_not_answer_is_not_observed_in_plan_and_apply_alike(capsys):
    """A guest whose VM runs but which does not answer: plan counts it not observed; apply, which could
    not observe it again either, counts it the same, as a failure (exit 3, as documented)."""
    import pytest

    from gpuvm.engine import Outcome
    from gpuvm.errors import ConnectError, TargetFailures
    from gpuvm.plan import Change, Plan
    from gpuvm.render import plan_summary
    from gpuvm.runs import Applied

    plan = Plan([Change("vm.advanced", "vm-2", "vm", "x", None, "1")], unobserved={"vm-1": "did not answer"})
    assert "1 target(s) not observed: vm-1" in plan_summary(plan)
    silent = ConnectError("vm-1: cannot connect to 10.0.0.11:22: Connection refused")
    applied = Applied(plan, Outcome(done={"vm-2": plan.changes}, failed={"vm-1 (observe)": silent}), journal=None)
    ApplyOutput(False, "text").summary(applied)
    summary = capsys.readouterr().out
    assert "0 other target(s) failed, 0 skipped, 1 not observed (failed)" in summary, summary
    with pytest.raises(TargetFailures) as verdict:
        applied.raise_for_outcome()
    assert str(verdict.value).startswith("1 target(s) not observed (failed):\n  vm-1 (observe): ")
    assert verdict.value.exit_code == 3
    # a step that failed besides, and another target never observed again: each counted once, in its kind
    applied.outcome.failed["vm-2 (vm.advanced)"] = ConnectError("vm-2: lost")
    plan.unobserved["esx-01"] = "banner"
    ApplyOutput(False, "text").summary(applied)
    assert "1 other target(s) failed, 0 skipped, 2 not observed (1 failed)" in capsys.readouterr().out
