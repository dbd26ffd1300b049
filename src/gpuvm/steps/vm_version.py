"""vm.version: the VM's hardware version (compatibility) raised to the runbook's `hardware_version`.

After vm.lifecycle (a clone has its template's version) and before vm.hardware, whose devices may
need the newer version (hw_versions.MIN_HW_VERSION). `UpgradeVM_Task` runs only on a powered-off VM,
so on a running one the change needs a power-off. A VM already at or past the version is left
alone: vSphere never downgrades. An upgrade a killed run left running is waited for, and the
version read again after it: an upgrade found done (or vCenter's AlreadyUpgraded) is success.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.plan import Change, Disruption
from gpuvm.desired import DesiredVm
from gpuvm.hw_versions import hw_version
from gpuvm.steps.base import Context, Step, present, vm_facts
from gpuvm.steps.power import power_off
from gpuvm.vsphere.facts import VmFacts
from gpuvm.errors import TaskError
from gpuvm.vsphere.tasks import call, run_task, wait_for_other_tasks

NAME = "vm.version"


@dataclass(frozen=True)
class UpgradeVm:
    version: str  # vmx-NN


def plan(vm: DesiredVm, facts: VmFacts) -> list[Change]:
    want = hw_version(vm.hardware_version)
    have = hw_version(facts.hw_version)
    if want is None or (have is not None and have >= want):
        return []
    off = Disruption.VM_POWER_OFF if facts.powered_on else Disruption.NONE
    return [Change(NAME, vm.name, "vm", "hardware_version", facts.hw_version or None, vm.hardware_version, off,
                   UpgradeVm(vm.hardware_version or ""))]


def upgraded(have: str | None, want: str) -> bool:
    """Whether a VM at version `have` needs no upgrade to `want`."""
    now, wanted = hw_version(have), hw_version(want)
    return now is not None and wanted is not None and now >= wanted


def apply(ctx: Context, vm: DesiredVm, changes: list[Change]) -> None:
    for change in changes:
        version = change.action.version
        power_off(ctx, vm.name)  # UpgradeVM_Task refuses a VM that is not off; planned as a disruption
        ref = ctx.session.ref("VirtualMachine", ctx.inventory.vms[vm.name].moid)
        wait_for_other_tasks(ctx.session, ref, ctx.options.task_timeout)  # e.g. an upgrade a killed run began
        if upgraded(call("read hardware version", lambda: ref.config.version), version):
            continue
        try:
            run_task(f"UpgradeVM_Task ({version})", lambda: ref.UpgradeVM_Task(version=version),
                     ctx.options.task_timeout)
        except TaskError as e:
            # upgraded by someone else between the read and the call: what was asked is there
            if "(AlreadyUpgraded)" not in str(e) or not upgraded(call("read hardware version",
                                                                      lambda: ref.config.version), version):
                raise


STEP = Step(NAME, "vm", vm_facts, plan, apply, wanted=present, restarts_guest=True)
