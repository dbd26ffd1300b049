"""vm.power: the power state the runbook asks for (default on), after all other VM changes."""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.plan import Change, Disruption
from gpuvm.resolve import DesiredVm
from gpuvm.steps.base import Context, Step
from gpuvm.steps.power import power_off, power_on

NAME = "vm.power"


@dataclass(frozen=True)
class SetPower:
    state: str  # on | off


def observe(ctx: Context, vm: DesiredVm) -> str:
    """The VM's power state when this step runs: "off" if an earlier step powers it off for its changes."""
    powered_off_before = any(c.disruption == Disruption.VM_POWER_OFF for c in ctx.planned_on(vm.name))
    return "off" if powered_off_before or not ctx.inventory.vms[vm.name].powered_on else "on"


def plan(vm: DesiredVm, state: str) -> list[Change]:
    if state == vm.power:
        return []
    disruption = Disruption.VM_POWER_OFF if vm.power == "off" else Disruption.NONE
    return [Change(NAME, vm.name, "vm", "power", "poweredOff" if state == "off" else "poweredOn",
                   "poweredOn" if vm.power == "on" else "poweredOff", disruption, SetPower(vm.power))]


def apply(ctx: Context, vm: DesiredVm, changes: list[Change]) -> None:
    for change in changes:
        (power_on if change.action.state == "on" else power_off)(ctx, vm.name)


STEP = Step(NAME, "vm", observe, plan, apply, restarts_guest=True)
