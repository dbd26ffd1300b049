"""A clone's network (`network:` of a `vms:` entry): its first virtual NIC, the template's, joins a
network of the VM's host. Checked at plan time (resolve.py): the template has a NIC, the network
exists and is one of the host's (HostSystem.network), else exit 2 naming the runbook line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvm.desired import CloneNetwork

if TYPE_CHECKING:
    from gpuvm.runbook.model import Runbook
    from gpuvm.runbook.vms import Vm
    from gpuvm.vsphere.facts import Inventory, VmFacts


def clone_network(rb: Runbook, i: int, vm: Vm, template: VmFacts, inventory: Inventory) -> CloneNetwork | None:
    if vm.network is None:
        return None
    loc = ("vms", i, "network")
    if template.nic is None:
        raise rb.error(loc, f"network '{vm.network}' for VM '{vm.name}': its template {vm.template} has no virtual NIC "
                            "to connect")
    named = inventory.networks.get(vm.network, [])
    host = inventory.hosts[vm.host]
    mine = [net for net in named if net.moid in host.networks]
    if len(mine) != 1:
        names = {net.moid: net.name for nets in inventory.networks.values() for net in nets}
        on_host = ", ".join(sorted({names[m] for m in host.networks if m in names})) or "none"
        if not named:
            why = f"not found in vCenter (networks of {vm.host}: {on_host})"
        elif not mine:
            why = f"not on host {vm.host} (its networks: {on_host})"
        else:
            why = f"names {len(mine)} networks of host {vm.host}"
        raise rb.error(loc, f"network '{vm.network}' for VM '{vm.name}' {why}")
    net = mine[0]
    return CloneNetwork(net.name, net.moid, template.nic.key, template.nic.type, net.portgroup_key, net.switch_uuid)
