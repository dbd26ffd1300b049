"""Guest changes planned during apply (guests observed again once gpuvm powered their VM on) need the
same flags as the plan's: one that needs VM power-off is not applied without --allow-power-off; that
guest fails naming the step and the flag, the other guests go on, the journal records it (issue 14)."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from gpuvm import engine
from gpuvm.errors import InputError, TargetFailures
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor, ok
from gpuvm.journal import Journal, past_entries
from gpuvm.plan import Change, Disruption, Plan
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.desired import Desired, DesiredVm
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_driver, vm_power
from gpuvm.steps.base import Context, Options

RUNBOOK = """
hosts:
  - {name: esx-01}
vms:
  - {name: gpu-vm-01, host: esx-01}
  - {name: gpu-vm-02, host: esx-01}
guests:
  driver: {version: 535.183.01, sha256: 566471e0de035a5a8b2ad38010378d34b3c5ccd147ff6070c9ca277e5625023f}
  hosts:
    - vm: gpu-vm-01
      ssh: {address: 10.0.0.13, user: root}
    - vm: gpu-vm-02
      ssh: {address: 10.0.0.14, user: root}
"""
QUERY = " ".join(guest_driver.QUERY)


def _guest(name: str, driver: CommandResult) -> FakeExecutor:
    return FakeExecutor(name, {"true": ok("true"), QUERY: driver})


@pytest.fixture
def world(tmp_path, mocker):
    """gpu-vm-01 boots with an older driver running (replacing it needs VM power-off), gpu-vm-02 with
    none (installed at once). vm.power and guest.driver's apply are fakes."""
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(RUNBOOK))
    fakes = {"gpu-vm-01": _guest("gpu-vm-01", ok(QUERY, "535.104.05\n")),
             "gpu-vm-02": _guest("gpu-vm-02", CommandResult(QUERY, 9, "", "couldn't communicate"))}
    cluster = build_cluster(load_runbook(path), tmp_path, RemoteOptions(executor_factory=lambda n, a: fakes[n]))
    installed = mocker.Mock()
    steps = {vm_power.NAME: dataclasses.replace(vm_power.STEP, apply=mocker.Mock(), apply_all=None),
             guest_driver.NAME: dataclasses.replace(guest_driver.STEP, apply=installed)}
    mocker.patch.object(engine, "STEPS", [steps.get(s.name, s) for s in engine.STEPS])
    desired = Desired(vms={n: DesiredVm(n, "esx-01", None, None, "efi", True, [], {}, "on") for n in fakes})
    plan = Plan([Change(vm_power.NAME, n, "vm", "power", "poweredOff", "poweredOn") for n in fakes])
    state = tmp_path / "state"
    state.mkdir()
    return plan, desired, cluster, installed, state


def _apply(world, allow_power_off: bool) -> engine.Outcome:
    plan, desired, cluster, _, state = world
    ctx = Context(options=Options(allow_power_off=allow_power_off, guest_boot_timeout=1), cluster=cluster)
    return engine.apply_plan(plan, desired, ctx, Journal(state), parallel=2)


def test_a_change_that_needs_power_off_found_after_boot_is_refused_without_the_flag(world):
    *_, installed, state = world
    outcome = _apply(world, allow_power_off=False)
    assert [call.args[1].name for call in installed.call_args_list] == ["gpu-vm-02"]  # the other guest goes on
    assert list(outcome.failed) == ["gpu-vm-01 (guest.driver)"]
    error = outcome.failed["gpu-vm-01 (guest.driver)"]
    assert isinstance(error, InputError) and "\n" not in str(error)
    assert "needs VM power-off" in str(error) and "--allow-power-off" in str(error)
    with pytest.raises(TargetFailures) as raised:
        engine.raise_failures(outcome)
    assert raised.value.exit_code == 2  # a refused disruptive change (README: exit codes)
    refused = [e for e in past_entries(state) if e.get("step") == guest_driver.NAME and e["target"] == "gpu-vm-01"]
    assert [e["status"] for e in refused] == ["failed"] and "--allow-power-off" in refused[0]["error"]
    assert refused[0]["disruption"] == Disruption.VM_POWER_OFF.value


def test_with_the_flag_both_guests_get_the_driver(world):
    *_, installed, _ = world
    outcome = _apply(world, allow_power_off=True)
    assert sorted(call.args[1].name for call in installed.call_args_list) == ["gpu-vm-01", "gpu-vm-02"]
    assert not outcome.failed


def test_a_guest_that_did_not_answer_when_planned_is_observed_again_and_progress_says_why(world):
    _, desired, cluster, _, state = world
    ctx = Context(options=Options(allow_power_off=True, guest_boot_timeout=1), cluster=cluster,
                  unreachable={"gpu-vm-02": ConnectionError("did not answer")})
    said = []
    engine.apply_plan(Plan(), desired, ctx, Journal(state), parallel=2, progress=lambda *a: said.append(a))
    [(step, target, status)] = [line for line in said if line[0] == "guest.*"]
    assert status.startswith("observed again as some did not answer when planned: ") and "VM changes" not in status
