"""Rolling reboots (issue 22, item 5): the engine lets `host.reboot` have the VM steps' changes on the
VMs it stopped made while they are off (`Context.while_off`), within the host's batch: each change is
made once (never again in its own step's turn), journalled and counted, and a failure there is the
VM's, like any other step's. The steps' applies are mocks; vSphere is not involved."""

from __future__ import annotations

import dataclasses
import json

from gpuvm import engine
from gpuvm.errors import TaskError
from gpuvm.journal import Journal
from gpuvm.plan import Change, Disruption, Plan
from gpuvm.resolve import Desired, DesiredHost, DesiredVm
from gpuvm.steps import host_reboot, vm_hardware, vm_power
from gpuvm.steps.base import Context


def test_changes_made_while_off_are_made_once_and_counted(tmp_path, mocker):
    order: list[tuple[str, str]] = []

    def reboot_all(ctx, by_target, parallel):
        order.append(("reboot", "esx-01"))
        held = ctx.while_off.run(["vm-1", "vm-3"])
        order.append(("back", ",".join(sorted({"vm-1", "vm-3"} - held))))
        return {}

    def hardware(ctx, vm, changes):
        order.append(("hardware", vm.name))
        if vm.name == "vm-3":
            raise TaskError("ReconfigVM failed: boom")

    power = mocker.Mock()
    steps = {host_reboot.NAME: dataclasses.replace(host_reboot.STEP, apply_all=reboot_all),
             vm_hardware.NAME: dataclasses.replace(vm_hardware.STEP, apply=hardware),
             vm_power.NAME: dataclasses.replace(vm_power.STEP, apply=power, apply_all=None)}
    mocker.patch.object(engine, "STEPS", [steps.get(s.name, s) for s in engine.STEPS])
    desired = Desired(hosts={h: DesiredHost(h, [], None, True) for h in ("esx-01", "esx-02")},
                      vms={v: DesiredVm(v, h, None, None, "efi", True, [], {}, "on")
                           for v, h in (("vm-1", "esx-01"), ("vm-2", "esx-02"), ("vm-3", "esx-01"))})
    new_gpu = {name: Change(vm_hardware.NAME, name, "pci device (new)", "device", None, "gpu", Disruption.VM_POWER_OFF)
               for name in ("vm-1", "vm-2", "vm-3")}
    plan = Plan([Change(host_reboot.NAME, "esx-01", "host", "reboot", "1", "rebooted", Disruption.HOST_REBOOT,
                        host_reboot.RebootHost()),
                 *new_gpu.values(),
                 *(Change(vm_power.NAME, name, "vm", "power", "poweredOff", "poweredOn", Disruption.NONE,
                          vm_power.SetPower("on")) for name in ("vm-1", "vm-2", "vm-3"))])
    state = tmp_path / "state"
    state.mkdir()
    journal = Journal(state)
    outcome = engine.apply_plan(plan, desired, Context(), journal)

    assert order[0] == ("reboot", "esx-01") and sorted(order[1:3]) == [("hardware", "vm-1"), ("hardware", "vm-3")]
    assert order[3:] == [("back", "vm-1"),  # vm-3's change failed: it stays off
                         ("hardware", "vm-2")]  # vm-2's host is not rebooted: its change comes in its step's turn
    assert new_gpu["vm-1"] in outcome.done["vm-1"] and new_gpu["vm-2"] in outcome.done["vm-2"]
    assert list(outcome.failed) == ["vm-3 (vm.hardware)"]
    assert outcome.skipped == {"vm-3 (vm.power)": "an earlier step failed on vm-3"}
    assert sorted(call.args[1].name for call in power.call_args_list) == ["vm-1", "vm-2"]
    lines = [json.loads(line) for line in journal.path.read_text().splitlines()]
    done = [line["target"] for line in lines if line.get("step") == vm_hardware.NAME and line["status"] == "done"]
    assert sorted(done) == ["vm-1", "vm-2"]
