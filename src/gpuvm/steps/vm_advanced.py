"""vm.advanced: extraConfig for P2P, 64-bit MMIO, NVLink with vGPU, NUMA affinity.

gpuvm owns the keys it sets (`pciPassthru.*`, `pciPassthru<n>.cfg.*`, `numa.nodeAffinity`): one
the runbook no longer asks for is removed. Other keys are left alone. On a powered-on VM a change
takes effect at the next power cycle, so it is marked as needing a power-off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.plan import Change, Disruption
from gpuvm.desired import DesiredVm
from gpuvm.steps.base import Context, Step, present, vm_facts
from gpuvm.steps.power import reconfigure
from gpuvm.vsphere.facts import VmFacts

NAME = "vm.advanced"
OWNED = re.compile(r"^(pciPassthru\.(allowP2P|RelaxACSforP2P|use64bitMMIO|64bitMMIOSizeGB)"
                   r"|pciPassthru\d+\.cfg\.enable_uvm|numa\.nodeAffinity)$")


@dataclass(frozen=True)
class SetExtraConfig:
    key: str
    value: str | None  # None removes the key


def _same(before: str | None, after: str | None) -> bool:
    return (before or "").lower() == (after or "").lower()


def plan(vm: DesiredVm, facts: VmFacts) -> list[Change]:
    off = Disruption.VM_POWER_OFF if facts.powered_on else Disruption.NONE
    changes = []
    for key, value in vm.extra_config.items():
        if not _same(facts.extra_config.get(key), value):
            changes.append(Change(NAME, vm.name, "extraConfig", key, facts.extra_config.get(key), value, off,
                                  SetExtraConfig(key, value)))
    for key, value in facts.extra_config.items():
        if OWNED.match(key) and key not in vm.extra_config and value != "":
            changes.append(Change(NAME, vm.name, "extraConfig", key, value, None, off, SetExtraConfig(key, None)))
    return changes


def config_spec(changes: list[Change]) -> object:
    from pyVmomi import vim

    # An empty value removes the key.
    return vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key=c.action.key, value=c.action.value or "")
                                          for c in changes])


def apply(ctx: Context, vm: DesiredVm, changes: list[Change]) -> None:
    reconfigure(ctx, vm.name, changes, config_spec(changes))


STEP = Step(NAME, "vm", vm_facts, plan, apply, wanted=present, restarts_guest=True)
