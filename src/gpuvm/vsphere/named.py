"""One vCenter's inventory under the names gpuvm gives the runbook's hosts and VMs: a name used in
several vCenters is `<vcenter>/<name>` (gpuvm/names.py), so that the inventories of a fleet merge
without one `esx-01` hiding another. vCenter's own names stay in the objects' moids' keeping: steps
reach objects by moid, and name them to vCenter with `vsphere_name`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpuvm.names import vsphere_name
from gpuvm.vsphere.facts import Inventory, VmFacts

if TYPE_CHECKING:
    from gpuvm.runbook.model import Runbook


def named_for(part: "Runbook", inventory: Inventory) -> Inventory:
    """A vCenter's inventory under the names its part of the runbook gives (`Runbook.part`)."""
    return renamed(inventory, [h.name for h in part.hosts], [v.name for v in part.vms])


def renamed(inventory: Inventory, hosts: Iterable[str], vms: Iterable[str]) -> Inventory:
    """`inventory` with the runbook's qualified `hosts` and `vms` (names gpuvm gives them) under those
    names, and every VM's and template's `host` too. As it is when none is qualified."""
    host_names = {vsphere_name(n): n for n in hosts if n != vsphere_name(n)}
    vm_names = {vsphere_name(n): n for n in vms if n != vsphere_name(n)}
    if not host_names and not vm_names:
        return inventory

    def vm(facts: VmFacts) -> VmFacts:
        update = {"name": vm_names[facts.name]} if facts.name in vm_names else {}
        if facts.host in host_names:
            update["host"] = host_names[facts.host]
        return facts.model_copy(update=update) if update else facts

    return Inventory(
        source=inventory.source, taken=inventory.taken,
        hosts={host_names.get(k, k): h.model_copy(update={"name": host_names[k]}) if k in host_names else h
               for k, h in inventory.hosts.items()},
        vms={vm_names.get(k, k): vm(v) for k, v in inventory.vms.items()},
        templates={k: vm(t) for k, t in inventory.templates.items()},
        datastores=inventory.datastores, folders=inventory.folders, pools=inventory.pools,
        networks=inventory.networks, foreign=inventory.foreign)
