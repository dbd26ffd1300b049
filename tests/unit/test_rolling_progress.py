"""A step that orders its targets itself (`apply_all`) and says when it begins and ends each
(`begins_targets`: host.reboot's rolling reboots) shows a target "started" when its turn comes, not
all of them at once up front, and "done" or "failed" when its turn ends."""

from __future__ import annotations

from gpuvm.engine import _Runner
from gpuvm.errors import TaskError
from gpuvm.journal import Journal
from gpuvm.plan import Change
from gpuvm.steps.base import Context, Step

CHANGES = {name: [Change("host.reboot", name, "host", "reboot", "1", "rebooted")] for name in ("esx-01", "esx-02", "esx-03")}


def one_at_a_time(ctx, by_target, parallel):
    """esx-01, then esx-02, which fails; esx-03 is never begun (as host.reboot leaves the batches
    after a failure)."""
    ctx.say("-", "working")
    ctx.begin("esx-01")
    ctx.say("esx-01", "rebooting")
    ctx.end("esx-01", None)
    ctx.begin("esx-02")
    ctx.end("esx-02", TaskError("reboot refused"))
    return {"esx-02": TaskError("reboot refused"), "esx-03": TaskError("not rebooted: esx-02 failed first")}


def run(tmp_path, begins: bool) -> list[tuple[str, str]]:
    said: list[tuple[str, str]] = []
    step = Step("host.reboot", "host", None, None, None, apply_all=one_at_a_time, begins_targets=begins)
    runner = _Runner(step, Context(), Journal(tmp_path), lambda name, target, status: said.append((target, status)),
                     {})
    failures = runner.all(CHANGES, 2)
    assert set(failures) == {"esx-02", "esx-03"}
    return [(target, status.split(":")[0].split(" (")[0]) for target, status in said if target != "-"]


def test_a_step_that_begins_its_targets_shows_each_started_when_its_turn_comes(tmp_path):
    assert run(tmp_path, begins=True) == [("esx-01", "started"), ("esx-01", "rebooting"), ("esx-01", "done"),
                                          ("esx-02", "started"), ("esx-02", "failed"), ("esx-03", "failed")]


def test_other_steps_start_every_target_up_front(tmp_path):
    assert run(tmp_path, begins=False)[:3] == [("esx-01", "started"), ("esx-02", "started"), ("esx-03", "started")]
