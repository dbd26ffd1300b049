"""vm.power: the power state the runbook asks for (default on), after all other VM changes."""

from __future__ import annotations

from gpuvm.plan import Change, Disruption
from gpuvm.resolve import Desired
from gpuvm.steps.base import ApplyContext
from gpuvm.steps.power import power_off, power_on
from gpuvm.vsphere.facts import Inventory

NAME = "vm.power"


def plan(desired: Desired, inventory: Inventory, prior: list[Change]) -> list[Change]:
    changes = []
    for vm in desired.vms.values():
        facts = inventory.vms[vm.name]
        # A VM that an earlier step powers off for its changes will be off by the time we get here.
        powered_off_before = any(c.target == vm.name and c.disruption == Disruption.VM_POWER_OFF for c in prior)
        state = "off" if (powered_off_before or not facts.powered_on) else "on"
        if state != vm.power:
            disruption = Disruption.VM_POWER_OFF if vm.power == "off" else Disruption.NONE
            changes.append(Change(NAME, vm.name, "vm", "power", "poweredOff" if state == "off" else "poweredOn",
                                  "poweredOn" if vm.power == "on" else "poweredOff", disruption,
                                  spec={"power": vm.power}))
    return changes


def apply(ctx: ApplyContext, target: str, changes: list[Change]) -> None:
    for change in changes:
        (power_on if change.spec["power"] == "on" else power_off)(ctx, target, NAME)


class VmPowerStep:
    name, scope = NAME, "vm"
    plan = staticmethod(plan)
    apply = staticmethod(apply)
