"""`--target`: the demo's plan (real data) narrowed to some hosts, VMs and guests, with the
dependencies on targets left out (gpuvm.targeting)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpuvm.errors import InputError
from gpuvm.plan import Change, Disruption, Plan
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps.guest_image import PlaceImage
from gpuvm.steps.host_reboot import RebootHost, StopForReboot
from gpuvm.steps.vm_hardware import AddDevice, RemoveDevice
from gpuvm.steps.vm_power import FreeGpu, SetPower
from gpuvm.targeting import Scope, select
from tests.unit.demo_plan import demo_plan
from tests.unit.factories import inventory, r750xa, vm

LAB = Path(__file__).parents[2] / "playbooks" / "lab.yaml"
DEMO = inventory([r750xa("esx-01"), r750xa("esx-02")],
                 [vm(f"esx-0{h}-vm{i}", f"esx-0{h}") for h in (1, 2) for i in (1, 2)])


def narrowed(plan: Plan, *names: str) -> Plan:
    return Scope(select(load_runbook(LAB), names), DEMO).narrow(plan)


def notes(plan: Plan) -> dict[str, str]:
    return {n.target: n.message for n in plan.notes if n.step == "target"}


def left(plan: Plan) -> dict[str, str]:
    """Targets with changes left out → why, and how many: `why (N)`."""
    counts = Counter(entry.change.target for entry in plan.left_out)
    return {target: f"{why} ({counts[target]})" for target, why in plan.left_out_by_target().items()}


def test_no_target_is_the_whole_plan_and_unknown_names_are_refused_naming_them():
    assert select(load_runbook(LAB), []) is None
    with pytest.raises(InputError) as refused:
        select(load_runbook(LAB), ["esx-01", "esx-9", "vm-x"])
    assert refused.value.exit_code == 2
    assert "--target esx-9, vm-x: no host, VM or guest of that name" in str(refused.value)
    assert "esx-01, esx-02" in str(refused.value)


def test_a_host_brings_its_vms_and_guests_but_not_the_mesh_the_other_guests_need_too():
    plan = narrowed(demo_plan(), "esx-01")
    assert set(plan.targets()) == {"esx-01", "esx-01-vm1", "esx-01-vm2"}
    whole = demo_plan()
    on_host = [c for c in whole.changes if c.target in plan.targets() and c.step != "guest.ssh_mesh"]
    assert plan.changes == on_host  # the host's reboot waits for exactly the changes it waited for
    assert not plan.for_step("guest.ssh_mesh")
    said = left(plan)
    assert said["esx-01-vm1"].startswith("the SSH mesh is one key") and said["esx-01-vm1"].endswith("(4)")
    assert "esx-02-vm1, esx-02-vm2 (not targeted) need mesh changes too" in said["esx-01-vm1"]
    assert [e.change for e in plan.left_out] == [c for c in whole.changes if c.step == "guest.ssh_mesh"
                                                 and c.target in ("esx-01-vm1", "esx-01-vm2")]
    assert notes(plan)["-"].startswith("not targeted: ") and "on esx-02, esx-02-vm1, esx-02-vm2" in notes(plan)["-"]
    assert [n.target for n in plan.notes if n.step == "resolve"] == ["esx-01-vm2"]  # its topology warning kept


def test_every_guest_targeted_keeps_the_mesh():
    plan = narrowed(demo_plan(), "esx-01", "esx-02")
    assert plan.changes == demo_plan().changes and not notes(plan) and plan.complete


def test_a_vm_whose_devices_wait_for_its_host_is_left_out_whole_and_says_why():
    plan = narrowed(demo_plan(), "esx-01-vm1")
    assert plan.empty  # its GPUs are not passthrough-active until esx-01 reboots: nothing half-done
    assert not plan.complete  # ... and the plan says so: its changes are listed, left out, and count
    assert left(plan) == {"esx-01-vm1": "waits on host esx-01 (8 change(s) planned there), not targeted (22)"}
    assert [e.change for e in plan.left_out] == [c for c in demo_plan().changes if c.target == "esx-01-vm1"]


def test_a_vm_whose_host_has_nothing_to_do_is_planned_alone():
    quiet = demo_plan()
    quiet.changes = [c for c in quiet.changes if c.target not in ("esx-02", "esx-02-vm1")]
    plan = narrowed(quiet, "esx-02-vm2")
    assert set(plan.targets()) == {"esx-02-vm2"}
    assert {c.step for c in plan.changes} == {"vm.hardware", "vm.advanced", "vm.power", "guest.image"}


def _change(step: str, target: str, action, before=None, after="x", resource="pci device (new)",
            disruption=Disruption.NONE) -> Change:
    return Change(step, target, resource, "device", before, after, disruption, action)


def test_an_image_copied_from_a_builder_left_out_that_builds_it_now_is_left_out():
    build = _change("guest.image", "esx-01-vm1", PlaceImage("dl:1", "build", "esx-01-vm1"), resource="image")
    copy = _change("guest.image", "esx-02-vm2", PlaceImage("dl:1", "copy", "esx-01-vm1"), resource="image")
    plan = narrowed(Plan(changes=[build, copy]), "esx-02-vm2")
    assert plan.empty
    assert left(plan) == {"esx-02-vm2": "its image is copied from esx-01-vm1, which builds it in this run (1)"}
    built = narrowed(Plan(changes=[copy]), "esx-02-vm2")  # the builder has the image already
    assert built.changes == [copy]


def test_a_gpu_moving_from_a_vm_left_out_leaves_the_vm_that_gets_it_out():
    remove = _change("vm.hardware", "esx-01-vm2", RemoveDevice(9000), before="0000:17:00.0", after=None,
                     resource="pci device 9000")
    add = _change("vm.hardware", "esx-01-vm1", AddDevice(None, "uuid"))  # type: ignore[arg-type]
    plan = narrowed(Plan(changes=[remove, add]), "esx-01-vm1")
    assert plan.empty
    assert left(plan) == {"esx-01-vm1": "its new devices wait on devices removed from esx-01-vm2, not targeted (1)"}
    both = narrowed(Plan(changes=[remove, add]), "esx-01-vm1", "esx-01-vm2")
    assert both.changes == [remove, add]


def test_a_gpu_held_by_a_dynamic_vm_both_ways():
    free = _change("vm.power", "esx-02-vm2", FreeGpu("0000:17:00.0", "esx-02-vm1"), resource="vm",
                   disruption=Disruption.VM_POWER_OFF)
    power = _change("vm.power", "esx-02-vm1", SetPower("on"), resource="vm")
    named = narrowed(Plan(changes=[free, power]), "esx-02-vm1")  # its power-on needs the holder off
    assert named.empty and "waits on esx-02-vm2 powered off" in left(named)["esx-02-vm1"]
    holder = narrowed(Plan(changes=[free, power]), "esx-02-vm2")  # no power-off for a VM left out
    assert holder.empty
    assert left(holder) == {"esx-02-vm2": "it powers esx-02-vm2 off to free a GPU for esx-02-vm1, which is not "
                                          "targeted (1)"}


def test_what_apply_plans_again_stays_narrowed_and_unobserved_guests_outside_do_not_count():
    whole = demo_plan()
    whole.unobserved = {"esx-02-vm1": "connection refused", "esx-01-vm2": "connection refused",
                        "esx-01": "banner timeout"}
    scope = Scope(select(load_runbook(LAB), ["esx-01-vm1", "esx-01-vm2", "esx-02"]), DEMO)
    plan = scope.narrow(whole)
    # esx-01-vm2 is left out whole, but it is targeted: not observed, it counts; esx-01 is not targeted
    assert plan.unobserved == {"esx-02-vm1": "connection refused", "esx-01-vm2": "connection refused"}
    assert set(plan.targets()) == {"esx-02", "esx-02-vm1", "esx-02-vm2"}  # esx-01's VMs wait for esx-01
    again = [c for c in whole.changes if c.step.startswith("guest.") and c.step != "guest.nic_ats"]
    assert {c.target for c in scope.keep(again)} == {"esx-02-vm1", "esx-02-vm2"}
    assert not scope.covers("esx-01-vm1") and scope.covers("esx-02-vm1")


def test_verify_reports_all_drift_on_the_targets_even_what_waits_for_others():
    selection = select(load_runbook(LAB), ["esx-01-vm1"])
    drift = selection.drift(demo_plan(), DEMO)
    assert drift.changes == [c for c in demo_plan().changes if c.target == "esx-01-vm1"] != []


def test_a_host_brings_the_vms_it_will_have_and_a_vm_destroyed_frees_nothing_for_others_left_out():
    clone = Change("vm.lifecycle", "esx-01-vm9", "vm", "exists", None, "create: clone of tpl on esx-01")
    selection = select(load_runbook(LAB), ["esx-01"])
    selection = type(selection)(selection.names, {**selection.hosts_of, "esx-01-vm9": "esx-01"})
    assert Scope(selection, DEMO).narrow(Plan(changes=[clone])).changes == [clone]  # not in vCenter yet
    destroy = Change("vm.lifecycle", "esx-01-vm2", "vm", "exists", "yes (on esx-01)", "DESTROYED",
                     Disruption.VM_DESTROY)
    add = _change("vm.hardware", "esx-01-vm1", AddDevice(None, "uuid"))  # type: ignore[arg-type]
    plan = narrowed(Plan(changes=[destroy, add]), "esx-01-vm1")
    assert plan.empty and "devices removed from esx-01-vm2" in left(plan)["esx-01-vm1"]


def _reboot_of_esx01(*more: Change) -> Plan:
    """esx-01's reboot pending (a passthrough setting made before), esx-01-vm2 running on it: stopped
    for the reboot, and so powered on again by vm.power."""
    pending = Change("host.passthrough", "esx-01", "pci 0000:17:00.0", "passthrough", "enabled, inactive",
                     "active", Disruption.HOST_REBOOT)
    reboot = Change("host.reboot", "esx-01", "host", "reboot", "1 change(s) waiting", "rebooted (maintenance mode)",
                    Disruption.HOST_REBOOT, RebootHost())
    stop = Change("host.reboot", "esx-01-vm2", "vm", "power", "poweredOn", "poweredOff for the reboot of esx-01",
                  Disruption.VM_POWER_OFF, StopForReboot("esx-01", restore=False))
    power = Change("vm.power", "esx-01-vm2", "vm", "power", "poweredOff", "poweredOn", action=SetPower("on"))
    return Plan(changes=[pending, reboot, stop, *more, power])


def test_a_vm_stopped_for_the_reboot_of_a_host_left_out_is_not_stopped_nor_started_by_the_run():
    plan = narrowed(_reboot_of_esx01(), "esx-01-vm2")
    assert plan.empty  # nothing the run would make: the stop is the host's reboot's, the power-on undoes it
    assert [e.change.step for e in plan.left_out] == ["host.reboot", "vm.power"]
    assert left(plan) == {"esx-01-vm2": "waits for the reboot of esx-01, not targeted; powers it on after the "
                                        "reboot of esx-01, not targeted (2)"}
    assert narrowed(_reboot_of_esx01(), "esx-01").changes == _reboot_of_esx01().changes  # with its host: all


def test_a_vm_that_its_own_change_powers_off_keeps_its_power_on_when_its_hosts_reboot_is_left_out():
    cpus = Change("vm.hardware", "esx-01-vm2", "vm", "cpus", 8, 16, Disruption.VM_POWER_OFF)
    plan = narrowed(_reboot_of_esx01(cpus), "esx-01-vm2")
    assert [(c.step, c.field) for c in plan.changes] == [("vm.hardware", "cpus"), ("vm.power", "power")]
    assert left(plan) == {"esx-01-vm2": "waits for the reboot of esx-01, not targeted (1)"}


def test_a_vm_the_runbook_wants_off_is_powered_off_on_its_own_when_its_hosts_reboot_is_left_out():
    """Its stop is the reboot's, but it is off after the reboot only because the runbook wants it off
    (vm.power plans no power-on): that power-off is the VM's own, the run makes it, not "for the reboot"."""
    wants_off = Plan(changes=[c for c in _reboot_of_esx01().changes if c.step != "vm.power"])
    plan = narrowed(wants_off, "esx-01-vm2")
    assert [(c.step, c.target, c.before, c.after, c.disruption, c.action) for c in plan.changes] == [
        ("vm.power", "esx-01-vm2", "poweredOn", "poweredOff", Disruption.VM_POWER_OFF, SetPower("off"))]
    assert plan.left_out == []
    assert narrowed(wants_off, "esx-01").changes == wants_off.changes  # with its host: the reboot's stop
