"""Tasks in flight, the windows an integration test cannot hit on purpose: an upgrade someone else
finished between gpuvm's read and its call (vCenter: AlreadyUpgraded) is success; any other fault is not."""

from __future__ import annotations

import pytest

from gpuvm.errors import TaskError
from gpuvm.plan import Change
from gpuvm.desired import DesiredVm
from gpuvm.steps import vm_version
from gpuvm.steps.base import Context
from gpuvm.vsphere.facts import Inventory, VmFacts

UPGRADE = Change("vm.version", "vm1", "vm", "hardware_version", "vmx-15", "vmx-19", action=vm_version.UpgradeVm("vmx-19"))


def upgrade(mocker, versions: list[str], fault: str) -> None:
    vm = DesiredVm(name="vm1", host="esx-01", cpus=1, memory_mb=1024, firmware="bios", reservation_locked=False,
                   devices=[], extra_config={}, power="on", hardware_version="vmx-19")
    ref = mocker.MagicMock()
    type(ref.config).version = mocker.PropertyMock(side_effect=versions)
    session = mocker.MagicMock()
    session.ref.return_value = ref
    mocker.patch.object(vm_version, "power_off")
    mocker.patch.object(vm_version, "wait_for_other_tasks", return_value=0)
    mocker.patch.object(vm_version, "run_task", side_effect=TaskError(f"UpgradeVM_Task (vmx-19) failed: {fault}"))
    ctx = Context(session=session, inventory=Inventory(vms={"vm1": VmFacts(name="vm1", moid="vm-1")}))
    vm_version.apply(ctx, vm, [UPGRADE])


def test_already_upgraded_to_the_version_asked_is_success(mocker):
    upgrade(mocker, ["vmx-15", "vmx-19"], "Virtual machine compatibility is already up-to-date. (AlreadyUpgraded)")


@pytest.mark.parametrize("versions, fault", [
    (["vmx-15", "vmx-15"], "Virtual machine compatibility is already up-to-date. (AlreadyUpgraded)"),
    (["vmx-15", "vmx-19"], "The attempted operation cannot be performed in the current state (poweredOn). (InvalidPowerState)"),
])
def test_other_faults_still_fail(mocker, versions, fault):
    with pytest.raises(TaskError, match=fault.split(" (")[0][:20]):
        upgrade(mocker, versions, fault)
