"""vm.power: the power state the runbook asks for (default on), after all other VM changes.

VMs that name their GPUs (classic DirectPath) power on first, then those whose GPUs vSphere picks at
power-on (dynamic DirectPath), so that a dynamic VM never takes a GPU another VM names. A running
dynamic VM that holds such a GPU already is powered off for it (planned, so refused up front without
--allow-power-off) and on again after the VM that names the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.executors.group import run_group
from gpuvm.plan import Change, Disruption
from gpuvm.desired import DesiredVm
from gpuvm.steps.base import Context, Step, present
from gpuvm.steps.power import power_off, power_on

NAME = "vm.power"


@dataclass(frozen=True)
class SetPower:
    state: str  # on | off
    dynamic: bool = False  # the VM takes GPUs by dynamic DirectPath: powered on after the others


@dataclass(frozen=True)
class FreeGpu:
    """Power a running VM off so that the GPU its dynamic DirectPath holds goes to the VM that names it."""

    address: str
    for_vm: str


@dataclass(frozen=True)
class PowerFact:
    state: str  # "on" | "off": when this step runs (off if an earlier step powers the VM off)
    held: tuple[tuple[str, str], ...] = ()  # (GPU the VM names, running VM holding it by dynamic DirectPath)


def _stopped_before(ctx: Context, vm: str) -> bool:
    """An earlier step powers the VM off for its changes."""
    return any(c.disruption == Disruption.VM_POWER_OFF for c in ctx.planned_on(vm))


def observe(ctx: Context, vm: DesiredVm) -> PowerFact:
    state = "off" if _stopped_before(ctx, vm.name) or not ctx.inventory.vms[vm.name].powered_on else "on"
    if state == "on" or vm.power == "off":
        return PowerFact(state)
    named = {d.address for d in vm.devices if d.kind == "classic"}
    held = tuple((d.assigned, other.name) for other in ctx.inventory.vms_on(vm.host)
                 if other.name != vm.name and other.powered_on and not _stopped_before(ctx, other.name)
                 for d in other.pci if d.kind == "dynamic" and d.assigned in named)
    return PowerFact(state, held)  # type: ignore[arg-type]


def set_power(vm: str, state: str, dynamic: bool = False) -> Change:
    """The change that powers `vm` on or off (`state`) from the other state."""
    before, after = ("poweredOff", "poweredOn") if state == "on" else ("poweredOn", "poweredOff")
    return Change(NAME, vm, "vm", "power", before, after,
                  Disruption.VM_POWER_OFF if state == "off" else Disruption.NONE, SetPower(state, dynamic))


def plan(vm: DesiredVm, fact: PowerFact) -> list[Change]:
    changes = []
    if fact.state != vm.power:
        changes.append(set_power(vm.name, vm.power, any(d.kind == "dynamic" for d in vm.devices)))
    for address, holder in fact.held:
        changes.append(Change(NAME, holder, "vm", "power", "poweredOn",
                              f"poweredOff, on again after {vm.name} (its dynamic DirectPath holds {address})",
                              Disruption.VM_POWER_OFF, FreeGpu(address, vm.name)))
    return changes


def apply_all(ctx: Context, by_target: dict[str, list[Change]], parallel: int) -> dict[str, Exception]:
    """Free the GPUs dynamic VMs hold for others, power VMs that name their GPUs, then the rest."""
    sets = {t: c.action for t, cs in by_target.items() for c in cs if isinstance(c.action, SetPower)}
    freed = {t for t, cs in by_target.items() if any(isinstance(c.action, FreeGpu) for c in cs)}
    failures: dict[str, Exception] = {}

    def wave(targets: dict[str, str], fn) -> None:
        failures.update(run_group({t: t for t in targets if t not in failures}, fn, parallel, name="power").failed)

    wave({t: t for t in freed}, lambda t: power_off(ctx, t))
    wave({t: t for t, a in sets.items() if not a.dynamic},
         lambda t: (power_on if sets[t].state == "on" else power_off)(ctx, t))
    later = {t: t for t, a in sets.items() if a.dynamic} | {t: t for t in freed if t not in sets}
    wave(later, lambda t: (power_off if t in sets and sets[t].state == "off" else power_on)(ctx, t))
    return failures


def apply(ctx: Context, vm: DesiredVm, changes: list[Change]) -> None:
    if failures := apply_all(ctx, {vm.name: changes}, 1):
        raise failures[vm.name]


STEP = Step(NAME, "vm", observe, plan, apply, apply_all=apply_all, wanted=present, restarts_guest=True)
